"""USD cost of token usage from a pricing table (SPEC §8): uncached input = input − cached."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, Field, ValidationError

from piserini_ray.errors import ConfigError, describe_validation_error
from piserini_ray.llm.usage import Usage


class Price(BaseModel):
    """USD per million tokens."""

    input: float = Field(ge=0)
    output: float = Field(ge=0)
    cache_read: float = Field(ge=0)
    cache_write: float | None = Field(None, ge=0)

    def cost(self, usage: Usage) -> float:
        uncached = max(0, usage.input_tokens - usage.cached_tokens - usage.cache_write_tokens)
        write_price = self.input if self.cache_write is None else self.cache_write
        return (
            uncached * self.input
            + usage.cached_tokens * self.cache_read
            + usage.cache_write_tokens * write_price
            + usage.output_tokens * self.output
        ) / 1_000_000


class PricingTable(BaseModel):
    models: dict[str, Price]

    def price(self, model: str) -> Price | None:
        return self.models.get(model)


def default_pricing_path() -> Path:
    """`configs/pricing.yaml` of the checkout this package runs from."""
    return Path(__file__).resolve().parents[2] / "configs" / "pricing.yaml"


def load_pricing(path: Path | None = None) -> PricingTable:
    path = path or default_pricing_path()
    try:
        return PricingTable.model_validate(yaml.safe_load(Path(path).read_text()))
    except FileNotFoundError:
        raise ConfigError(f"pricing table {path} does not exist") from None
    except ValidationError as e:
        raise ConfigError(
            f"pricing table {path} is invalid: {describe_validation_error(e)}"
        ) from None
