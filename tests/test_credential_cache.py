"""B5, B6: the credential cache shared by the event loop and the reader threads."""

import threading

import pytest

from controlplane.iam import cache as cache_module
from controlplane.iam.cache import CredentialCache
from controlplane.iam.decide import Principal


def principal(n: int) -> Principal:
    return Principal(credential_id=f"cred_{n}", tenant_id="acme", statements=None)


def test_b5_a_principal_read_before_a_revocation_is_not_put_back_after_it() -> None:
    cache = CredentialCache()
    epoch = cache.epoch  # a reader thread reads the credential: live
    cache.clear()  # meanwhile the revocation commits and clears the cache
    cache.put(b"h", principal(1), epoch)  # the reader's late put
    assert cache.get(b"h") is None
    cache.put(b"h", principal(1), cache.epoch)
    assert cache.get(b"h") == principal(1)


def test_b6_threads_filling_a_full_cache_never_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    """Four threads putting, getting and clearing past MAX_ENTRIES: no KeyError, no
    RuntimeError (eviction under the lock), and the cache stays within its bound."""
    monkeypatch.setattr(cache_module, "MAX_ENTRIES", 64)
    cache = CredentialCache()
    errors: list[BaseException] = []

    def work(offset: int) -> None:
        try:
            for n in range(5_000):
                key = f"{offset}-{n}".encode()
                cache.put(key, principal(n), cache.epoch)
                cache.get(key)
                if n % 1_000 == 999:
                    cache.clear()
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(cache._by_hash) <= 64
