"""Diagnostic rules: one small function per finding code, registered in ``RULES``.

Every rule reads a ``Context`` (the session's facts, blob rows, tool-call rows, thresholds, the
session record, and whether the session is over) and returns findings. Rules never touch the
store, so the batch and the live analysis run the same code. ``final`` is False while a capture
is in progress: rules then give an answer time to arrive (``Config.live_grace_frames``) and do
not call a stream "ended".

A rule fires on evidence of harm, not on a departure from one client's habits: healthy traffic
of any client style gives no finding at all (docs/analysis.md, "What each rule needs").

Severities: ``error`` for stalls, refusals and protocol violations the run cannot recover from;
``warning`` for data-loss hazards and anomalies that may or may not bite; ``info`` is never used.

The rules live by concept in ``rules_obligations`` (what the client owes during a run),
``rules_args`` (tool-call arguments), ``rules_stream`` (a run as a whole, errors) and
``rules_transport`` (the HTTP exchanges carrying it) and ``rules_client`` (how a run's transport
ended around its turn: retries, cancels, lost framing); this module gathers them.
"""

from __future__ import annotations

from workbench.analysis import rules_args, rules_client, rules_obligations, rules_stream, rules_transport
from workbench.analysis.context import RULES, Context, Rule, RuleFn, rule
from workbench.analysis.model import Finding

_MODULES = (rules_obligations, rules_args, rules_stream, rules_transport, rules_client)  # importing them registers the rules


def run_rules(ctx: Context, codes: list[str] | None = None) -> list[Finding]:
    out: list[Finding] = []
    for code, r in RULES.items():
        if codes is not None and code not in codes:
            continue
        out.extend(r.fn(ctx))
    return out


__all__ = ["RULES", "Context", "Rule", "RuleFn", "rule", "run_rules"]
