"""The report's opening paragraph: what the predictive policy cost and how well it served, in plain words;
and how the report writes money.

The paragraph is written from the ``--json`` document alone (:meth:`Result.to_json`,
or :meth:`FrontierResult.to_json` with the frontier), so every figure in it can be
checked against what ``backtest --json`` prints. Only what that document does not
hold is passed in: the currency and the GPUs the prewarm budget allows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from predictive_scaler.series import format_duration, parse_duration

if TYPE_CHECKING:
    from predictive_scaler.backtest.runner import Result


def currency(result: Result) -> str:
    """The currency the scenario's prices are in (spec.prewarm.budget.currency; USD unless set)."""
    cur = result.setup.spec.prewarm.budget.currency
    return cur if isinstance(cur, str) and cur else "?"


def price(result: Result) -> float:
    """Price of one GPU-hour in the simulated cluster, in :func:`currency`."""
    return float(result.setup.scenario.cluster.price_per_gpu_hour)


def money(value: float | None, currency: str) -> str:
    """An amount with its currency: whole units from 100 up (cents would be noise), cents below."""
    if value is None:
        return "–"
    return f"{value:,.0f} {currency}" if abs(value) >= 100 else f"{value:,.2f} {currency}"


def share(value: float | None) -> str:
    """A share of demand served, as the tables print it."""
    return "–" if value is None else f"{100 * value:.2f} %"


def _minutes(n: float) -> str:
    text = f"{n:,.0f}"
    return f"{text} minute" if text == "1" else f"{text} minutes"


def _change(new: float, old: float) -> tuple[str, str]:
    """How much ``new`` differs from ``old``, in per cent of ``old``, and which way ("more"/"less")."""
    if new == old or old <= 0:
        return "", "more" if new > old else "the same"
    rel = new / old - 1
    return f"{100 * abs(rel):.1f} %", "more" if rel > 0 else "less"


def duration_words(duration: str) -> str:
    """A duration as the scenario writes it ("42d", "12h", "60s") in words: "42 days", "12 hours", "1 minute"."""
    seconds = int(parse_duration(duration).total_seconds())
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            n = seconds // size
            return f"{n} {unit}{'s' if n != 1 else ''}"
    return format_duration(parse_duration(duration))


def span_text(evaluation: str | None) -> str:
    """The evaluated span as words: "the 42 days evaluated", "the day evaluated"."""
    return f"the {duration_words(evaluation).removeprefix('1 ')} evaluated" if evaluation else "the evaluated span"


def headline(doc: Mapping[str, Any], *, currency: str, allowed_gpus: int | None = None) -> str:
    """One paragraph: predictive against the reactive default, at equal service (when the frontier ran),
    its wasted prewarm cost and whether its prewarm budget held."""
    policies = doc.get("policies", {})
    pred, react = policies.get("predictive"), policies.get("reactive")
    if pred is None or react is None:
        missing = " and ".join(n for n in ("predictive", "reactive") if n not in policies)
        return (f"This backtest did not run the {missing} policy, so it cannot say what predictive scaling costs "
                "against reactive scaling; the tables below give each policy that ran.")
    scenario = doc.get("scenario", {})
    parts = [_against_default(pred, react, scenario, currency)]
    if "headline" in doc:
        parts.append(_at_equal_service(pred, doc["headline"], currency))
    else:
        parts.append("(Run the backtest with --frontier to compare the two at equal service.)")
    parts.append(_prewarm(pred, currency, allowed_gpus))
    return " ".join(p for p in parts if p)


def _against_default(pred: Mapping[str, Any], react: Mapping[str, Any], scenario: Mapping[str, Any],
                     currency: str) -> str:
    amount, way = _change(pred["cost"], react["cost"])
    target = scenario.get("target_utilization")
    baseline = "reactive scaling (the HPA rule" + (f" at its default {100 * target:.0f} % target" if target else "")
    if amount:
        cost = f"{amount} {way} than {baseline}: {money(react['cost'], currency)})"
    else:
        cost = f"against {money(react['cost'], currency)} for {baseline})"
    p_unmet, r_unmet = pred["unmet_minutes"], react["unmet_minutes"]
    if r_unmet > 0 and p_unmet == 0:
        unmet = f"never left demand unmet, where reactive did in {_minutes(r_unmet)}"
    elif r_unmet > 0:
        fewer, direction = _change(p_unmet, r_unmet)
        direction = "fewer" if direction == "less" else direction
        unmet = (f"left demand unmet in {_minutes(p_unmet)} against reactive's {r_unmet:,.0f}"
                 + (f" ({fewer} {direction})" if fewer and p_unmet != r_unmet else ""))
    elif p_unmet > 0:
        unmet = f"left demand unmet in {_minutes(p_unmet)} where reactive left none"
    else:
        unmet = "neither left any demand unmet"
    served = ""
    if pred.get("slo_attainment") is not None and react.get("slo_attainment") is not None:
        served = f"; it served {share(pred['slo_attainment'])} of demand against {share(react['slo_attainment'])}"
    return (f"Over {span_text(scenario.get('evaluation'))}, the predictive policy cost "
            f"{money(pred['cost'], currency)}, {cost}, and {unmet}{served}.")


def _at_equal_service(pred: Mapping[str, Any], figures: Mapping[str, Any], currency: str) -> str:
    ratio, gap = figures.get("cost_ratio_vs_reactive"), figures.get("gap_closed_vs_reactive")
    if ratio is None or ratio <= 0:
        return (f"No reactive target tried serves as much as the {share(pred.get('slo_attainment'))} predictive "
                "serves, so there is no reactive cost at equal service to compare with.")
    reference = pred["cost"] / ratio
    amount, way = _change(pred["cost"], reference)
    saved = abs(reference - pred["cost"])
    out = (f"At equal service, reactive scaling tuned to serve as much would cost {money(reference, currency)}: "
           f"predictive costs {amount} {way} ({money(saved, currency)} {'saved' if way == 'less' else 'extra'})")
    if gap is not None and gap > 0:
        out += (f", closing {100 * gap:.0f} % of the gap between that cost and the oracle's (perfect foresight "
                "of demand, the same start-up times)")
    return out + "."


def _prewarm(pred: Mapping[str, Any], currency: str, allowed_gpus: int | None) -> str:
    wasted, cost = pred.get("wasted_prewarm_cost") or 0.0, pred["cost"]
    if wasted > 0:
        of = f" ({100 * wasted / cost:.1f} % of its cost)" if cost > 0 else ""
        waste = f"Capacity it added ahead of demand and then left unused cost {money(wasted, currency)}{of}"
    else:
        waste = "None of its cost went on capacity added ahead of demand and then left unused"
    over = pred.get("minutes_over_budget")
    if over is None:
        return waste + "."
    if allowed_gpus == 0:
        return f"{waste}; its prewarm budget allows no GPUs ahead of demand (see the notes)."
    budget = "the prewarm budget" + (f" of {allowed_gpus} GPUs" if allowed_gpus is not None else "")
    if over == 0:
        return f"{waste}; {budget} held ({_minutes(over)} over it)."
    return f"{waste}; {budget} was exceeded in {_minutes(over)}."
