"""Imported once by mockproc's forkserver, before it forks any mock: the server's modules
and the default model's tokenizer, which every forked mock then has at once."""

from examforge.tokens import encoding_for
from mockllm import MODEL_ID
from mockllm import server  # noqa: F401 (imported for the forks)
from mockllm import service  # noqa: F401

encoding_for(MODEL_ID)
