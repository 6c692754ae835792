"""The simulated backend's model listings: ``agent.v1.AgentService`` and ``aiserver.v1.AiService``.

Both ``GetUsableModels`` methods answer the same catalogue (``--models``) with the overlay's
``GetUsableModelsResponse`` messages, in whatever framing the caller used: the CLI asks the
agent.v1 one in binary Connect, stateless proxies the AiService one as Connect JSON
(``{"models": [{"modelId": …}]}``), older ones in gRPC-Web. ``--model-listing`` serves only one of
them, to reproduce an upstream where the other answers ``unimplemented``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from workbench.schema import pb
from workbench.transport.unary import UnaryHandler, UnaryRequest, typed_unary

AGENT_MODELS_PATH = "/agent.v1.AgentService/GetUsableModels"
AISERVER_MODELS_PATH = "/aiserver.v1.AiService/GetUsableModels"
LISTINGS = {"agent": AGENT_MODELS_PATH, "aiserver": AISERVER_MODELS_PATH}
LISTING_CHOICES = ("both", "agent", "aiserver")


def display_name(model: str) -> str:
    return model.replace("-", " ").title()


def _entries(cls: Any, models: Sequence[str]) -> list[Any]:
    return [cls(model_id=m, display_model_id=m, display_name=display_name(m), display_name_short=display_name(m))
            for m in models]


def listing_handlers(models: Sequence[str], which: str = "both") -> dict[str, UnaryHandler]:
    """Unary handlers by path for the listing(s) ``which`` names (both, agent, aiserver)."""
    if which not in LISTING_CHOICES:
        raise ValueError(f"model listing {which!r}: choose one of {', '.join(LISTING_CHOICES)}")
    catalogue = tuple(models)

    async def agent(_req: Any, _call: UnaryRequest) -> Any:
        return pb.GetUsableModelsResponse(models=_entries(pb.ModelDetails, catalogue))

    ai_response = pb.message("aiserver.v1.GetUsableModelsResponse")
    ai_entry = pb.message("aiserver.v1.UsableModel")

    async def aiserver(_req: Any, _call: UnaryRequest) -> Any:
        return ai_response(models=_entries(ai_entry, catalogue))

    out: dict[str, UnaryHandler] = {}
    if which in ("both", "agent"):
        out[AGENT_MODELS_PATH] = typed_unary(pb.GetUsableModelsRequest, agent)
    if which in ("both", "aiserver"):
        out[AISERVER_MODELS_PATH] = typed_unary(pb.message("aiserver.v1.GetUsableModelsRequest"), aiserver)
    return out
