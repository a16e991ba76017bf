"""OpenAI-compatible HTTP server: `python app.py serve --target T --draft D [--host 127.0.0.1]
[--port 8000] [--api-key KEY] [--ui]`.

Endpoints: /v1/models, /v1/completions, /v1/chat/completions (JSON or server-sent events),
/health; with --ui the Gradio app under /ui, in the same process and on the same loaded model.

How a request runs (the only generation path is `Session.generate`):
  * the handler validates the body (pydantic), builds a `session.Request` from it and the server's
    command-line defaults, and puts a `Job` on the model's bounded queue; a full queue answers 429
    at once, in the OpenAI error shape;
  * one worker thread per loaded model takes jobs one at a time, leases the model's `Session`
    from the pool (shared with the UI, so the UI and the API never decode at the same time), frames
    the prompt, checks it against the context, and runs `Session.generate(req, stop)`, handing each
    step's released tokens to the handler's event loop;
  * the Session keeps the KV cache between requests, so a chat client that resends the
    conversation each turn gets only the new turn prefilled (`timings.cache_n`, `prompt_n`);
  * a client that disconnects (mid-stream, or while waiting) sets the job's stop event: the engine
    ends at the next step and the worker takes the next job;
  * Ctrl-C (SIGINT) or SIGTERM stops every running and waiting job the same way, so each open stream
    ends with its final chunk (finish_reason) and [DONE] before the server exits (130 after Ctrl-C).

Responses carry llama-server's `timings` (prompt_n, cache_n, predicted_per_second, draft_n,
draft_n_accepted, ...) plus acceptance, alpha and mean accepted tokens per target call; streamed
chunks carry per-token provenance in `edgespec` (token ids, text pieces, sources
draft/target/bonus, and the drafter of each accepted draft token).

Security: 127.0.0.1 by default; any other address needs --api-key (then every /v1 request needs
`Authorization: Bearer KEY`, and the UI a login whose password is the key); chat templates from
GGUF metadata are rendered in Jinja's sandbox (edgespec.runtime.chat_template).

The package, each part depending only on those before it:
  * `protocol`: the OpenAI wire format (request bodies, body -> session.Request, response objects);
  * `worker`: `Job` and `ModelSlot` (the bounded queue and the worker thread of a served model);
  * `http`: `Server` (what is served, the defaults, the API key) and the FastAPI app (`create_app`);
  * `cli`: `python app.py serve` (`main`, `build_parser`, `load`).
"""

from edgespec.apps.server.cli import build_parser, load, main
from edgespec.apps.server.http import Server, create_app
from edgespec.apps.server.protocol import ApiError
from edgespec.apps.server.worker import Job, ModelSlot

__all__ = ["ApiError", "Job", "ModelSlot", "Server", "build_parser", "create_app", "load", "main"]
