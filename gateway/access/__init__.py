"""Access: who is calling and what they may do.

auth/       credentials -> Principal (API keys, JWT against an offline JWKS, mTLS subjects)
identity    the ASGI middleware that authenticates every non-public request
guards      role guards for the admin and compliance routes (each access audited)
keys        the first admin key and the `airgate keys` commands' core
keys_api    the admin API for keys (POST/GET/DELETE /admin/keys)
limits/     GCRA rate and concurrency limits (Redis or in process)
stack       `Security`: keys, policy, limits and the audit writer, opened once per app
"""

__all__: list[str] = []
