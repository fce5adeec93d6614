"""The endpoint backend of `longctx eval`: a model served over an OpenAI-compatible API (vLLM,
SGLang, TGI, llama.cpp's server, `transformers serve`) evaluated with the same tasks, prompts,
scoring, cells and files as in process. client.py speaks HTTP, server.py checks what the server
says before any prompt, backend.py runs a cell's requests, command.py is `longctx eval --endpoint`."""
