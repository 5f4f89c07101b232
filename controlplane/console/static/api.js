// The control plane's HTTP API (DESIGN §3): POST /api/<service>/<group>/<method> with a JSON
// object body and a Bearer token, on this origin only (the console's CSP allows no other).

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export async function call(token, path, body, signal) {
  let response;
  try {
    response = await fetch(`/api/${path}`, {
      method: "POST",
      headers: { "Content-Type": "application/json", Authorization: `Bearer ${token}` },
      body: JSON.stringify(body),
      cache: "no-store",
      credentials: "omit",
      signal,
    });
  } catch (error) {
    if (error.name === "AbortError") throw error;
    throw new ApiError(0, "UNREACHABLE", "the control plane did not answer");
  }
  const answer = await response.json().catch(() => null);
  if (!response.ok) {
    const error = answer && answer.error;
    throw new ApiError(
      response.status,
      error ? error.code : `HTTP ${response.status}`,
      error ? error.message : response.statusText,
    );
  }
  return answer;
}

// B1: every item of a list method, following `next` (the cursor of the next page) until it is
// null. A page may be empty and still have a `next`: the cursor moves past items the token may
// not read, so only a null (or absent) `next` ends the list.
export async function listAll(token, path, body, signal) {
  const items = [];
  let page = await call(token, path, body, signal);
  items.push(...page.items);
  while (page.next !== undefined && page.next !== null) {
    page = await call(token, path, { ...body, cursor: page.next }, signal);
    items.push(...page.items);
  }
  return items;
}
