"""The Ollama protocol adapter: Ollama's API (docs/api.md of the ollama repository) on the
same port, through the same pipeline as the OpenAI adapter (auth, policy, limits, audit).

    chat      POST /api/chat              (action "chat.completions")
    generate  POST /api/generate          (action "completions")
    embed     POST /api/embed, /api/embeddings  (action "embeddings")
    models    GET /api/tags, /api/ps, /api/version;  POST /api/show
    refused   pull, push, create, copy, delete, blobs: 403 (models come as signed bundles)
    types     the wire Structs;  options  `options` -> sampling;  outputs  format, tools,
              messages;  reply  the answer (NDJSON or one object);  ndjson  lines, durations

Errors take Ollama's shape, `{"error": "..."}`, on every `/api/` path (gateway/errors.py).
"""

__all__: list[str] = []
