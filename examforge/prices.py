"""What a model's tokens cost: a built-in price table, overridden by `LLM_PRICE_*` settings.

USD per million prompt and per million completion tokens, at the providers' standard
(non-batch, uncached) list prices. Sources, checked on 2026-11-30 (prices change: set
`LLM_PRICE_PROMPT_PER_MTOK` and `LLM_PRICE_COMPLETION_PER_MTOK` to override):
- OpenAI: developers.openai.com/api/docs/pricing (the older models as last listed there);
- Anthropic: docs.claude.com pricing, for the model ids its OpenAI-compatible endpoint and
  the common gateways (OpenRouter `anthropic/...`) accept;
- open models: the host's own price list (Groq, Together AI), for the model ids those hosts
  use. The same open model elsewhere (a local Ollama, your own vLLM) has no built-in price.

A model with no price here and none configured is booked at $0, and every command that
starts work says so on one line: a $0 bill must never be a surprise.
"""

from __future__ import annotations

from dataclasses import dataclass

AS_OF = "2026-11-30"

# model id -> (prompt, completion) USD per million tokens, and where the figure comes from.
_OPENAI = "OpenAI pricing page"
_ANTHROPIC = "Anthropic pricing page"
BUILTIN: dict[str, tuple[float, float, str]] = {
    # OpenAI
    "gpt-5.5": (5.00, 30.00, _OPENAI),
    "gpt-5.4": (2.50, 15.00, _OPENAI),
    "gpt-5.1": (1.25, 10.00, _OPENAI),
    "gpt-5": (1.25, 10.00, _OPENAI),
    "gpt-5-mini": (0.25, 2.00, _OPENAI),
    "gpt-5-nano": (0.05, 0.40, _OPENAI),
    "gpt-4.1": (2.00, 8.00, _OPENAI),
    "gpt-4.1-mini": (0.40, 1.60, _OPENAI),
    "gpt-4.1-nano": (0.10, 0.40, _OPENAI),
    "gpt-4o": (2.50, 10.00, _OPENAI),
    "gpt-4o-mini": (0.15, 0.60, _OPENAI),
    "o3": (2.00, 8.00, _OPENAI),
    "o3-mini": (1.10, 4.40, _OPENAI),
    "o4-mini": (1.10, 4.40, _OPENAI),
    "gpt-4-turbo": (10.00, 30.00, _OPENAI),
    "gpt-3.5-turbo": (0.50, 1.50, _OPENAI),
    # Anthropic (through an OpenAI-compatible endpoint or gateway)
    "claude-sonnet-5-5": (2.00, 10.00, _ANTHROPIC),
    "claude-sonnet-5": (2.00, 10.00, _ANTHROPIC),
    "claude-opus-4-7": (5.00, 25.00, _ANTHROPIC),
    "claude-opus-4-6": (5.00, 25.00, _ANTHROPIC),
    "claude-opus-4-5": (5.00, 25.00, _ANTHROPIC),
    "claude-opus-4-1": (15.00, 75.00, _ANTHROPIC),
    "claude-opus-4": (15.00, 75.00, _ANTHROPIC),
    "claude-sonnet-4-5": (3.00, 15.00, _ANTHROPIC),
    "claude-sonnet-4": (3.00, 15.00, _ANTHROPIC),
    "claude-3-7-sonnet": (3.00, 15.00, _ANTHROPIC),
    "claude-3-5-sonnet": (3.00, 15.00, _ANTHROPIC),
    "claude-haiku-4-5": (1.00, 5.00, _ANTHROPIC),
    "claude-3-5-haiku": (0.80, 4.00, _ANTHROPIC),
    "claude-3-haiku": (0.25, 1.25, _ANTHROPIC),
    # Open models, at the host that names them this way
    "llama-3.3-70b-versatile": (0.59, 0.79, "Groq pricing page"),
    "llama-3.1-8b-instant": (0.05, 0.08, "Groq pricing page"),
    "meta-llama/llama-3.3-70b-instruct-turbo": (0.88, 0.88, "Together AI pricing page"),
    # The bundled mock server is free.
    "mock-model": (0.0, 0.0, "examforge's mock server"),
}


@dataclass(frozen=True)
class Price:
    prompt_per_mtok: float
    completion_per_mtok: float
    source: str  # "LLM_PRICE_* settings", "<table source>, <date>", or "unknown"

    @property
    def known(self) -> bool:
        return self.source != "unknown"

    def cost_usd(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (prompt_tokens * self.prompt_per_mtok
                + completion_tokens * self.completion_per_mtok) / 1_000_000


UNKNOWN = Price(0.0, 0.0, "unknown")


def _candidates(model: str) -> list[str]:
    """`model` as written, without a gateway's provider prefix, and without a dated snapshot
    suffix: `openai/gpt-4o-mini-2024-07-18` finds `gpt-4o-mini`, `claude-sonnet-4-5-20250929`
    and `anthropic/claude-sonnet-4.5` find `claude-sonnet-4-5`."""
    name = model.strip().lower()
    out = [name]
    if "/" in name and name not in BUILTIN:
        out.append(name.split("/", 1)[1])
    for base in list(out):
        dotted = base.replace(".", "-") if base.startswith("claude") else base
        out.append(dotted)
        parts = dotted.split("-")
        # Drop a trailing date (20250929, 2024-07-18) or "latest".
        while parts and (parts[-1].isdigit() and len(parts[-1]) >= 2 or parts[-1] == "latest"):
            parts.pop()
            out.append("-".join(parts))
    return out


def builtin_price(model: str) -> Price | None:
    for name in _candidates(model):
        if name in BUILTIN:
            prompt, completion, source = BUILTIN[name]
            return Price(prompt, completion, f"{source}, {AS_OF} ({name})")
    return None


def resolve(model: str, prompt_per_mtok: float | None,
            completion_per_mtok: float | None) -> Price:
    """The configured prices if given, else the table's, else UNKNOWN ($0, and a warning)."""
    if prompt_per_mtok is not None and completion_per_mtok is not None:
        return Price(prompt_per_mtok, completion_per_mtok, "LLM_PRICE_* settings")
    return builtin_price(model) or UNKNOWN
