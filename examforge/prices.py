"""What a model's tokens cost: Pydantic's `genai-prices` data, overridden by `LLM_PRICE_*`.

USD per million prompt, cached prompt and completion tokens, at the providers' standard
(non-batch) list prices. The figures are the price data bundled in the installed
`genai-prices` package, which is maintained upstream (its `data.py` is generated from the
providers' pricing pages and carries cached, cache-write and batch prices). To update them,
upgrade the package (`pip install -U genai-prices`), or set `LLM_PRICE_PROMPT_PER_MTOK`,
`LLM_PRICE_COMPLETION_PER_MTOK` and `LLM_PRICE_CACHED_PROMPT_PER_MTOK`.

Offline by design: `genai-prices` can fetch newer prices from the network, but only through
its `UpdatePrices` class, which examforge never starts. A lookup here reads the data bundled in
the package and nothing else (`genai_prices.calc_price` uses the bundled snapshot unless
`UpdatePrices` installed another), so a worker never blocks on the network for a price.

A model is looked up at the provider its base URL names (api.openai.com, api.groq.com,
openrouter.ai, ...), then by its id alone, then under the provider of a gateway prefix
(`openai/gpt-4o-mini`). A model with no price there and none configured is booked at $0,
and every command that starts work says so on one line: a $0 bill must never be a surprise.
The bundled mock server's model is free.

Processing tiers (OpenAI's `service_tier`): the prices above are standard-tier prices. A call
served at another tier is priced by `Price.at_tier`: at the price data's own price for that
tier when the price came from the data and the data has one (genai-prices carries OpenAI's
flex and priority prices as price variants: priority is 1.7x to 2x standard depending on the
model, flex is offered for some models only); otherwise (LLM_PRICE_* settings, a model whose
data has no price for the tier) at a multiple of the standard price (`Price.scaled`, factors in
`Settings.tier_factor`): flex at LLM_FLEX_PRICE_FACTOR (0.5: OpenAI bills flex at its Batch
rates, half the standard ones), priority at LLM_PRIORITY_PRICE_FACTOR (2.0: the GPT-5 family's).

Cached prompt tokens are part of `prompt_tokens` in OpenAI's usage: `Price.cost_usd` bills
`prompt - cached` at the prompt price and `cached` at the cached price. A model whose data has
no cached price (no cache discount) bills cached tokens at the prompt price.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from decimal import Decimal
from functools import lru_cache
from importlib.metadata import version

log = logging.getLogger(__name__)

SETTINGS_SOURCE = "LLM_PRICE_* settings"
MOCK_MODEL = "mock-model"


@dataclass(frozen=True)
class Price:
    prompt_per_mtok: float
    completion_per_mtok: float
    source: str  # "LLM_PRICE_* settings", "genai-prices <version> (<provider>/<model>)", ...
    # USD per million cached prompt tokens (a prompt-cache read); None: the prompt price.
    cached_prompt_per_mtok: float | None = None
    # (provider id, model id) in genai-prices when the price came from it: where a processing
    # tier's own price is looked up (at_tier).
    data_ref: tuple[str, str] | None = field(default=None, compare=False)

    @property
    def known(self) -> bool:
        return self.source != "unknown"

    @property
    def cached_per_mtok(self) -> float:
        return self.prompt_per_mtok if self.cached_prompt_per_mtok is None \
            else self.cached_prompt_per_mtok

    def scaled(self, factor: float, tier: str | None = None) -> "Price":
        """This price times `factor`: a processing tier's (LLM_SERVICE_TIER) price, every rate
        alike (OpenAI's flex prices are its Batch prices, half of each standard rate)."""
        if factor == 1.0 or not self.known:
            return self  # an unknown price stays unknown ($0, and said so)
        cached = None if self.cached_prompt_per_mtok is None \
            else self.cached_prompt_per_mtok * factor
        return Price(self.prompt_per_mtok * factor, self.completion_per_mtok * factor,
                     f"{self.source} x {factor:g}" + (f" ({tier} tier)" if tier else ""),
                     cached)

    def at_tier(self, tier: str | None, factor: float) -> "Price":
        """The price of a call served at `tier`: the price data's own price for that tier when
        this price came from the data and the data has one, else this price times `factor`
        (the tier's LLM_*_PRICE_FACTOR)."""
        if tier and self.data_ref is not None:
            found = tier_price(*self.data_ref, tier)
            if found is not None:
                return found
        return self.scaled(factor, tier)

    def cost_usd(self, prompt_tokens: int, completion_tokens: int,
                 cached_tokens: int = 0) -> float:
        """The one place a cost is computed. `cached_tokens` are the part of `prompt_tokens`
        the provider read from its prompt cache (OpenAI's `prompt_tokens_details.cached_tokens`):
        they are billed at the cached price, the rest of the prompt at the prompt price."""
        cached = min(max(cached_tokens, 0), prompt_tokens)
        return ((prompt_tokens - cached) * self.prompt_per_mtok
                + cached * self.cached_per_mtok
                + completion_tokens * self.completion_per_mtok) / 1_000_000


UNKNOWN = Price(0.0, 0.0, "unknown")
FREE_MOCK = Price(0.0, 0.0, "examforge's mock server", 0.0)


def _base_rate(value: object) -> float | None:
    """A price from the data as a float. Tiered prices (a higher rate past 200k or 272k prompt
    tokens) give their base rate: examforge's prompts are a few thousand tokens."""
    if value is None:
        return None
    base = getattr(value, "base", value)
    return float(base) if isinstance(base, (Decimal, int, float)) else None


def _lookups(model: str, base_url: str | None) -> list[dict[str, str]]:
    """The genai-prices lookups to try, most specific first."""
    name = model.strip().lower()
    tries: list[dict[str, str]] = []
    if base_url:
        tries.append({"model_ref": name, "provider_api_url": base_url})
    tries.append({"model_ref": name})
    if "/" in name:
        provider, _, rest = name.partition("/")
        tries.append({"model_ref": rest, "provider_id": provider})
        tries.append({"model_ref": rest})
    return tries


@lru_cache(maxsize=64)
def library_price(model: str, base_url: str | None = None) -> Price | None:
    """The price of `model` in genai-prices' bundled data, or None when it has none."""
    if not model.strip():
        return None
    from genai_prices import Usage, calc_price

    for kwargs in _lookups(model, base_url):
        ref = kwargs.pop("model_ref")
        try:
            calc = calc_price(Usage(input_tokens=0, output_tokens=0), ref,
                              **kwargs)  # type: ignore[call-overload]
        except LookupError:
            continue
        mp = calc.model_price
        prompt, completion = _base_rate(mp.input_mtok), _base_rate(mp.output_mtok)
        if prompt is None or completion is None:
            continue
        return Price(prompt, completion,
                     f"genai-prices {version('genai-prices')} "
                     f"({calc.provider.id}/{calc.model.id})",
                     _base_rate(mp.cache_read_mtok), (calc.provider.id, calc.model.id))
    return None


@lru_cache(maxsize=64)
def tier_price(provider_id: str, model_id: str, tier: str) -> Price | None:
    """The price data's price of `model_id` at `provider_id` for calls served at the
    processing tier `tier` (a `service_tier` price variant), or None when the data has no
    price of its own for that tier."""
    from genai_prices import Usage, calc_price

    try:
        calc = calc_price(Usage(input_tokens=0, output_tokens=0), model_id,
                          provider_id=provider_id, price_context={"service_tier": tier})
    except LookupError:
        return None
    if not any(variant.when == {"service_tier": tier}
               and any(v is not None for v in vars(variant.prices).values())
               for variant in calc.model.price_variants or ()):
        return None
    mp = calc.model_price
    prompt, completion = _base_rate(mp.input_mtok), _base_rate(mp.output_mtok)
    if prompt is None or completion is None:
        return None
    return Price(prompt, completion,
                 f"genai-prices {version('genai-prices')} "
                 f"({calc.provider.id}/{calc.model.id}, {tier} tier)",
                 _base_rate(mp.cache_read_mtok), (calc.provider.id, calc.model.id))


def resolve(model: str, prompt_per_mtok: float | None, completion_per_mtok: float | None,
            cached_prompt_per_mtok: float | None = None, *,
            base_url: str | None = None) -> Price:
    """The configured prices if given, else the price data's, else UNKNOWN ($0, a warning).

    The cached price: `cached_prompt_per_mtok` when set; else, with the data's prices, the
    data's cached price; with configured prompt and completion prices, the configured prompt
    price (no discount assumed: a cost never below the bill)."""
    if prompt_per_mtok is not None and completion_per_mtok is not None:
        return Price(prompt_per_mtok, completion_per_mtok, SETTINGS_SOURCE,
                     cached_prompt_per_mtok)
    if model.strip().lower() == MOCK_MODEL:
        return FREE_MOCK
    found = library_price(model, base_url)
    if found is None:
        return UNKNOWN
    if cached_prompt_per_mtok is not None:
        return Price(found.prompt_per_mtok, found.completion_per_mtok,
                     f"{found.source}, cached: {SETTINGS_SOURCE}", cached_prompt_per_mtok)
    return found
