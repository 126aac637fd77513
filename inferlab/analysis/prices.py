"""Prices, each a dated and sourced row: what an hour of a device costs, and what an API charges.

Prices change every few months, so the course keeps them in two files and computes from the
rows, never from a number typed into a page:

- ``data/prices.csv``: one device for one hour (``usd_per_hour``), from a provider's offering
  (an 8-GPU instance's hourly price is divided by 8), with the date the price held and where it
  was read;
- ``data/api_prices_2026.csv``: what a provider charges per million input, cached input (a
  cache hit), cache-write (an input token stored for later calls) and output tokens for one of
  its current models, and its batch API's discount, with the date and source; a figure the
  source did not give stays empty (None), never a guess.

Every row has a ``status``: ``secondary`` (read in a copy or a report of the source, as listed
in the course's FACTS sheet) or ``unverified`` (the author's recollection of the provider's
page; the book says so wherever it prints one). Loading refuses a row without a source, a
parseable date (``YYYY-MM-DD`` or ``YYYY-MM``) or a known status, so a price cannot enter the
book undated; ``tests/test_prices.py`` checks both files. Updating a row updates every number
computed from it.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass

from inferlab.data import read_table

STATUSES = ("verified", "secondary", "unverified")


def parse_date(text: str) -> _dt.date:
    """``YYYY-MM-DD``, or ``YYYY-MM`` for a price known to the month (read as the 1st)."""
    text = text.strip()
    try:
        return _dt.date.fromisoformat(text if len(text) != 7 else text + "-01")
    except ValueError:
        raise ValueError(f"{text!r} is not a date of the form YYYY-MM-DD or YYYY-MM") from None


def checked_row(row: dict, file: str) -> dict:
    """``row`` of ``data/<file>`` after checking that it is sourced, dated and has a known status
    (every table of prices, chips and cost inputs is read through it)."""
    where = f"data/{file}, row {row.get('name') or row.get('model') or row.get('key') or row}"
    if not row.get("source", "").strip():
        raise ValueError(f"{where}: no source")
    parse_date(row.get("date", ""))
    if row.get("status") not in STATUSES:
        raise ValueError(f"{where}: status must be one of {STATUSES}")
    return row


@dataclass(frozen=True)
class DevicePrice:
    """One device for one hour, from one provider, as of ``date``."""

    device: str            # a row of data/hardware.csv
    usd_per_hour: float
    provider: str
    offering: str
    date: str
    source: str
    status: str

    @property
    def usd_per_second(self) -> float:
        return self.usd_per_hour / 3600

    def label(self) -> str:
        """How the book cites it: "$6.88/h (AWS, 2026-11-09, secondary)"."""
        return f"${self.usd_per_hour:.2f}/h ({self.provider}, {self.date}, {self.status})"


@dataclass(frozen=True)
class TokenPrice:
    """What an API charges per million tokens of one model, as of ``date``."""

    provider: str
    model: str
    usd_per_m_input: float
    usd_per_m_cached_input: float | None   # a cache hit (None: not published)
    usd_per_m_cache_write: float | None    # an input token written to the cache (a miss)
    usd_per_m_output: float
    date: str
    source: str
    status: str
    batch_discount: float | None = None     # share of the price the batch API saves

    @property
    def output_over_input(self) -> float:
        return self.usd_per_m_output / self.usd_per_m_input

    @property
    def has_cache_prices(self) -> bool:
        return self.usd_per_m_cached_input is not None and self.usd_per_m_cache_write is not None

    @property
    def cached_discount(self) -> float:
        """Share of the input price saved on a cached input token."""
        if self.usd_per_m_cached_input is None:
            raise ValueError(f"{self.provider} {self.model}: no cached-input price")
        return 1 - self.usd_per_m_cached_input / self.usd_per_m_input


def device_prices() -> list[DevicePrice]:
    """Every row of ``data/prices.csv``, checked."""
    return [DevicePrice(r["device"], float(r["usd_per_hour"]), r["provider"], r["offering"],
                        r["date"], r["source"], r["status"])
            for r in (checked_row(row, "prices.csv") for row in read_table("prices.csv"))]


def device_price(device: str, provider: str | None = None) -> DevicePrice:
    """The newest row for ``device`` (from ``provider`` if given); unknown ones list the known."""
    rows = [p for p in device_prices() if p.device.lower() == device.lower()
            and (provider is None or p.provider.lower() == provider.lower())]
    if not rows:
        known = sorted({f"{p.device} ({p.provider})" for p in device_prices()})
        raise ValueError(f"no price for {device!r}" + (f" from {provider!r}" if provider else "")
                         + f" in data/prices.csv; it has: {', '.join(known)}")
    return max(rows, key=lambda p: parse_date(p.date))


def _optional(text: str) -> float | None:
    return float(text) if text.strip() else None


def token_prices(with_cache_prices: bool = False) -> list[TokenPrice]:
    """Every row of ``data/api_prices_2026.csv``, checked (only those that publish cached-input
    and cache-write prices when ``with_cache_prices``)."""
    rows = [TokenPrice(r["provider"], r["model"], float(r["usd_per_m_input"]),
                       _optional(r["usd_per_m_cached_input"]), _optional(r["usd_per_m_cache_write"]),
                       float(r["usd_per_m_output"]), r["date"], r["source"], r["status"],
                       _optional(r["batch_discount"]))
            for r in (checked_row(row, "api_prices_2026.csv")
                      for row in read_table("api_prices_2026.csv"))]
    return [p for p in rows if p.has_cache_prices] if with_cache_prices else rows


# -- dollars per million tokens, from a price and a rate ---------------------------------------
MILLION = 1e6


def usd_per_million(usd_per_hour: float, tokens_per_s: float) -> float:
    """Dollars per million tokens for a device at ``usd_per_hour`` serving ``tokens_per_s``."""
    if usd_per_hour < 0 or tokens_per_s <= 0:
        raise ValueError(f"need a price >= 0 and a positive rate, got {usd_per_hour}, "
                         f"{tokens_per_s}")
    return usd_per_hour / 3600 / tokens_per_s * MILLION


def bandwidth_floor_usd_per_m(weight_bytes: float, kv_bytes_per_token: float, bandwidth: float,
                              batch: int, context: int, usd_per_hour: float) -> float:
    """Dollars per million output tokens when decode runs at the bandwidth floor.

    A step of ``batch`` sequences of ``context`` tokens reads the weights once and every
    sequence's K/V: (W + batch x context x KV) / bandwidth seconds for ``batch`` tokens.
    """
    step = (weight_bytes + batch * context * kv_bytes_per_token) / bandwidth
    return usd_per_million(usd_per_hour, batch / step)


def break_even_price(fast_usd_per_hour: float, fast_tokens_per_s: float,
                     slow_tokens_per_s: float) -> float:
    """The hourly price at which the slower device's tokens cost what the faster one's do."""
    return fast_usd_per_hour * slow_tokens_per_s / fast_tokens_per_s
