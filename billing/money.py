"""Money: currencies, minor units and the rounding rule of every invoice line.

Rule: an amount is ``gpu_seconds x unit_price / 3600`` computed exactly with
:class:`~decimal.Decimal`, then rounded **once per line, half-even, to the currency's minor
unit** (ISO 4217 "minor unit" column: USD/EUR 2 -> 0.01, JPY 0 -> 1, KWD 3 -> 0.001). Totals are
sums of rounded lines, so they always add up.

The table lists the currencies NVKE accepts; its minor units are ISO 4217's (the ISO 4217
maintenance agency's list one, "Minor unit"). A 12-entry table beats a CLDR dependency here:
CLDR's accounting digits differ from ISO 4217 for some currencies, and the invoice rule is ISO's.
"""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Decimal

#: ISO 4217 alphabetic code -> minor unit (digits after the decimal point).
MINOR_UNITS: dict[str, int] = {
    "USD": 2,
    "EUR": 2,
    "GBP": 2,
    "CHF": 2,
    "CAD": 2,
    "AUD": 2,
    "INR": 2,
    "SGD": 2,
    "CNY": 2,
    "JPY": 0,
    "KRW": 0,
    "KWD": 3,
}

SECONDS_PER_HOUR = Decimal(3600)
#: Display precision of GPU-hours (the amount always uses the exact GPU-seconds).
GPU_HOURS_PLACES = Decimal("0.000001")


def minor_unit(currency: str) -> int:
    """Digits after the decimal point of ``currency``; ValueError for an unknown code."""
    try:
        return MINOR_UNITS[currency]
    except KeyError:
        raise ValueError(
            f"unknown currency {currency!r}; accepted: {', '.join(sorted(MINOR_UNITS))}"
        ) from None


def quantum(currency: str) -> Decimal:
    """The smallest amount of ``currency`` as a Decimal exponent: USD -> 0.01, JPY -> 1."""
    return Decimal(1).scaleb(-minor_unit(currency))


def round_money(amount: Decimal, currency: str) -> Decimal:
    """``amount`` rounded half-even to the currency's minor unit."""
    return amount.quantize(quantum(currency), rounding=ROUND_HALF_EVEN)


def line_amount(gpu_seconds: Decimal, unit_price: Decimal, currency: str) -> Decimal:
    """The amount of one invoice line: ``round_half_even(gpu_seconds x unit_price / 3600)``.

    ``unit_price`` is per GPU-hour. Example: 86,400 GPU-seconds (24 GPU-hours) at 2.50 USD ->
    60.00 USD; 514.2852 GPU-seconds (one 1g GPU instance for an hour, fraction 0.142857) at 2.80 USD
    -> 0.3999996 -> 0.40 USD.
    """
    return round_money(gpu_seconds * unit_price / SECONDS_PER_HOUR, currency)


def gpu_hours(gpu_seconds: Decimal) -> Decimal:
    """GPU-seconds as GPU-hours rounded half-even to 6 places (for display only)."""
    return (gpu_seconds / SECONDS_PER_HOUR).quantize(GPU_HOURS_PLACES, rounding=ROUND_HALF_EVEN)


def format_rate(rate: Decimal, currency: str) -> str:
    """A unit price with at least the currency's minor digits: ``2.50``, ``2.125``, ``400``."""
    exact = rate.normalize()
    digits = max(-exact.as_tuple().exponent, minor_unit(currency), 0)
    return f"{rate.quantize(Decimal(1).scaleb(-digits)):f}"
