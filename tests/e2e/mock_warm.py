"""Imported once by mockproc's forkserver, before it forks any mock: the server's modules
and the default model's tokenizer, which every forked mock then has at once."""

import importlib

from examforge.tokens import encoding_for
from mockllm import MODEL_ID

for _module in ("mockllm.server", "mockllm.service"):
    importlib.import_module(_module)
encoding_for(MODEL_ID)
