"""A response's life in the engine: started (its reply item opened, its prefill queued), cancelled, and ended.

:class:`ResponseLifecycle` opens a response on :meth:`start`, marks it on :meth:`cancel` (the next plan ends it, so a
cancel stops every stage within one step), and ends it with one final status: ``completed``/``incomplete`` once every
stage is done, ``cancelled``, or ``failed`` (one response's error never ends another). A step's responses end in
:meth:`update_from_output`, from the step's plan and output; a conversation closing or a step that raised ends them
between steps. Ending gives the response's engine resources back first (the scheduler withdraws it), then sends its
last events. Engine thread only.
"""

from __future__ import annotations

import logging
import time

from pipeline.core.conversation_state import ConvItem, ItemKind
from pipeline.core.conversations import Conversations
from pipeline.core.response_state import ResponseSpec, ResponseState, TextEnd
from pipeline.core.seeds import Seeds
from pipeline.errors import EngineFailure, PipelineError, ResponseActiveError, no_audio_output
from pipeline.observe.observer import EngineObserver
from pipeline.output.detokenizer import IncrementalDetokenizer, markup_ids
from pipeline.output.function_calls import function_calls
from pipeline.output.processor import OutputProcessor
from pipeline.response_events import ResponseStatus
from pipeline.runners.model_runner import ModelRunner
from pipeline.scheduler.plan import PlannedEnd, StepOutput, StepPlan
from pipeline.scheduler.policies import Cleanup, failure_cleanup
from pipeline.scheduler.scheduler import Scheduler
from pipeline.tools import ToolMode

__all__ = ["ResponseLifecycle"]

log = logging.getLogger("pipeline.core.engine_core")


class ResponseLifecycle:
    def __init__(
        self,
        *,
        scheduler: Scheduler,
        conversations: Conversations,
        runner: ModelRunner,
        output: OutputProcessor,
        observer: EngineObserver,
        renderer,
        seeds: Seeds,
        speaks: bool,
    ) -> None:
        self.scheduler = scheduler
        self.conversations = conversations
        self.runner = runner
        self.output = output
        self.observer = observer
        self.renderer = renderer
        self.markup = markup_ids(renderer.tokenizer)
        """Token ids whose text never reaches a reply's text (the tokenizer's added tokens)."""
        self.seeds = seeds
        self.speaks = speaks
        """Whether the engine has a talker: without one a spoken response is refused."""

    def start(self, spec: ResponseSpec) -> None:
        """Open the reply item at the end of the conversation and queue the response's prefill. Any conversation is
        answered: with no items (or no user item) the prompt is the instructions and the reply's header, so the reply
        answers the instructions (a greeting). Raises ``UnsupportedInputError`` for a spoken response of an engine
        without a talker, before anything is opened."""
        if spec.audio and not self.speaks:
            raise no_audio_output()
        conv = self.conversations.get(spec.conv_id)
        if conv.active_response is not None:
            raise ResponseActiveError("a response is already in progress for this conversation", param="response")
        calls = function_calls(self.renderer, conv.tools, spec)
        item = ConvItem(id=spec.item_id, role="assistant", kind=ItemKind.REPLY, open=True)
        conv.add(item)
        conv.active_response = spec.id
        r = ResponseState(
            spec=spec,
            conv=conv,
            item=item,
            detok=IncrementalDetokenizer(self.renderer.decode, hidden=self.markup),
            calls=calls,
            seed=self.seeds.response_seed(),
            started_at=time.perf_counter(),
            started_at_s=time.monotonic(),
        )
        if spec.tool_choice.mode is ToolMode.REQUIRED:  # the reply opens the call; the model completes it
            assert calls is not None, "function_calls raises for a required call without tools"
            item.reply_ids = self.renderer.tools.forced(spec.tool_choice.name)
            r.thinker.silent = True
            calls.prime(item.reply_ids)
        self.scheduler.add_response(r)
        self.observer.milestone(spec.id, "started", r.started_at)

    def cancel(self, response_id: str, reason: str) -> None:
        """Mark a live response cancelled (the first reason stays); the next plan ends it. Unknown ids are ignored."""
        r = self.scheduler.responses.get(response_id)
        if r is not None and r.cancel_reason is None:
            r.cancel_reason = reason

    def update_from_output(self, plan: StepPlan, output: StepOutput) -> bool:
        """Apply what a step made: end the responses the plan ended (cancelled, or failed while planning), then those
        that failed while the plan ran, then those whose every stage is done and whose stream the worker does not
        hold (``incomplete`` at the text token limit, else ``completed``). The one place a step ends responses.
        Returns whether a response finished by itself."""
        for end in plan.ends:
            self._end_planned(end)
        for response_id, error in output.failures.items():
            failed = self.scheduler.responses.get(response_id)
            if failed is not None:
                self.fail(failed, error)
        done = self.scheduler.finished(plan.decoding, output.in_worker)
        for r in done:
            incomplete = r.thinker.end is TextEnd.MAX_TOKENS
            self.finish(
                r,
                ResponseStatus.INCOMPLETE if incomplete else ResponseStatus.COMPLETED,
                "max_output_tokens" if incomplete else None,
            )
        return bool(done)

    def _end_planned(self, end: PlannedEnd) -> None:
        """End a response the plan withdrew: ``cancelled``, or ``failed`` with the error its planning raised."""
        r = self.scheduler.withdrawn(end.response_id)
        if end.error is None:
            self._finish(r, ResponseStatus.CANCELLED, r.cancel_reason)
        else:
            self._fail(r, end.error)

    def end_cancelled(self, response_id: str) -> None:
        """End a response ``cancelled`` because its conversation closed."""
        self.finish(self.scheduler.responses[response_id], ResponseStatus.CANCELLED, "conversation_closed")

    def finish(self, r: ResponseState, status: ResponseStatus, reason: str | None, error: Exception | None = None):
        """End ``r`` with a final ``status``: its engine resources go back, then its last events."""
        self.scheduler.withdraw(r, Cleanup())
        self._finish(r, status, reason, error)

    def _finish(self, r: ResponseState, status: ResponseStatus, reason: str | None, error: Exception | None = None):
        """The response's side of its end, once the scheduler has withdrawn it: its final status, its stream closed
        (unless the worker holds it: then when the worker hands it back), its last events."""
        self.observer.milestone(r.id, status.value)
        self.observer.finished += 1
        r.advance(status)
        r.talker.length = 0
        if r.audio.stream is not None:
            if not self.runner.in_worker(r):  # else closed when the worker hands it back
                r.audio.stream.close()
            r.audio.stream = None
        self.output.finish(r, status, reason, error)

    def fail(self, r: ResponseState, exc: Exception) -> None:
        """End ``r`` ``failed``: clients get a :class:`~pipeline.errors.PipelineError` (an internal error is logged
        and replaced by :class:`~pipeline.errors.EngineFailure`); caches a stage may have left half-updated are
        released (:func:`pipeline.scheduler.policies.failure_cleanup`)."""
        self.scheduler.withdraw(r, failure_cleanup(exc, prefilling=r.status is ResponseStatus.PREFILLING))
        self._fail(r, exc)

    def _fail(self, r: ResponseState, exc: Exception) -> None:
        if not isinstance(exc, PipelineError):
            log.error("response %s failed inside the engine", r.id, exc_info=exc)
            # the traceback is in the server log; clients get no internals
            exc = EngineFailure("the engine failed while generating this response")
        self._finish(r, ResponseStatus.FAILED, "error", exc)

    def fail_all(self) -> None:
        """End every live response ``failed`` (the engine loop's answer to a step that raised), after the ends its plan
        had decided (their update never ran)."""
        for end in self.scheduler.unfinished_ends():
            self._end_planned(end)
        for r in list(self.scheduler.responses.values()):
            self.fail(r, EngineFailure("the engine failed while generating this response"))
