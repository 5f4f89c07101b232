"""IAM: tokens, principals, and the decision function."""
