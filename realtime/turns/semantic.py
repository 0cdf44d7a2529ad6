"""The decision policy of ``semantic_vad``: when to ask the turn model, and when the user's turn ends. Sans-I/O: no
clock, no I/O, no threads; every input is given by the caller.

Inputs, for one silence run (from the moment server VAD hears the speech stop until speech resumes or the turn ends):

- ``silence_ms``: the run's length so far (the VAD's silence, on the session's audio clock);
- ``probability``: the turn model's answer for this run, P(the turn is complete), or ``None`` (not asked yet, not
  answered yet, the scorer was saturated or failed);
- ``eagerness``: the client's ``semantic_vad`` setting, as OpenAI describes it: ``high`` answers soonest, ``low``
  lets the user take their time, ``auto`` is ``medium``.

The rule (:meth:`SemanticPolicy.end_of_turn_ms`): the model is asked once, after ``score_after_ms`` of silence. A
turn it judges complete (``probability >= complete_at``) ends at once; one it judges incomplete ends after
``max_wait_ms`` of silence, the eagerness's patience with a user who pauses mid-sentence; without an answer the
turn ends after ``unscored_wait_ms``, as silence-based detection would end it. An answer that arrives later moves
the end to where it puts it; an end already passed ends the turn at once.

:class:`SemanticTurnTracker` applies the policy to one session's silence runs in order: it says when to ask the model
(:class:`ScoreTurn`) and when the turn ends (:class:`EndTurn`), ignores answers that come too late, and ends turns on
silence alone once the model has failed.

The transcript so far is not an input: the user's speech is transcribed only once the turn is committed.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Eagerness(str, enum.Enum):
    """``turn_detection.eagerness`` of ``semantic_vad``."""

    LOW = "low"
    MEDIUM = "medium"
    AUTO = "auto"
    HIGH = "high"

    def resolved(self) -> Eagerness:
        """``auto`` is ``medium`` (as in the OpenAI API); the others are themselves."""
        return Eagerness.MEDIUM if self is Eagerness.AUTO else self


@dataclass(frozen=True)
class EagernessLimits:
    """How one eagerness reads the model. Times are milliseconds of silence since the speech stopped."""

    complete_at: float
    """A probability at or above this ends the turn at once."""
    max_wait_ms: int
    """A turn judged incomplete ends after this much silence anyway."""
    unscored_wait_ms: int
    """A turn without an answer (not yet, saturated, failed) ends after this much silence."""

    def __post_init__(self) -> None:
        if isinstance(self.complete_at, bool) or not isinstance(self.complete_at, (int, float)):
            raise ValueError(f"complete_at must be a number, got {self.complete_at!r}")
        if not 0.0 <= self.complete_at <= 1.0:
            raise ValueError(f"complete_at must be between 0 and 1, got {self.complete_at}")
        for name in ("max_wait_ms", "unscored_wait_ms"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative integer number of milliseconds, got {value!r}")


# Why these values: on the espeak-ng fixtures (realtime/bench/turn_fixtures.py; scripts/turn_accuracy.py prints the
# tables) Smart Turn v3.2 tells a sentence cut mid-way from a complete one only a little better than chance: cut
# sentences score as high as complete ones, except at the very top. So medium and low end a turn at once only on a
# near-certain "complete", and wait out the longest mid-sentence pause otherwise, which keeps the share of pauses the
# server cuts into under 10 %. High does what its name asks: it answers as soon as the model says complete, at the
# price of cutting into pauses. A model that separates better (human speech) lets complete_at come down.
LOW = EagernessLimits(
    complete_at=0.99,  # only the model's most certain answers end a turn at once: the user takes their time
    max_wait_ms=3000,  # three seconds to think aloud (OpenAI's low waits up to 8 s; past 3 s a user asks "hello?")
    unscored_wait_ms=800,  # without the model: the silence window semantic_vad used for low before it had one
)
MEDIUM = EagernessLimits(
    complete_at=0.98,  # a few % of cut sentences score this high: few pauses are cut into at once
    max_wait_ms=1300,  # outwaits a 1.2 s mid-sentence pause, and the VAD's ~100 ms to call a silence
    unscored_wait_ms=500,  # without the model: server VAD's default silence window
)
HIGH = EagernessLimits(
    complete_at=0.5,  # the model's own decision boundary: answer whenever it says complete
    max_wait_ms=700,  # a pause past this is taken as the end: shorter than most mid-sentence pauses, on purpose
    unscored_wait_ms=300,  # without the model: short, yet past score_after_ms plus the model's ~50 ms a call
)


@dataclass(frozen=True)
class SemanticVadConfig:
    """The server's settings of ``semantic_vad`` (one value per setting; see :data:`LOW`, :data:`MEDIUM`,
    :data:`HIGH` for each value's reason)."""

    score_after_ms: int = 200
    """Silence before the model is asked: server VAD's frames need ~100 ms to call a silence; the model is trained on
    turns that end in ~200 ms of silence; a reply that starts here can still beat 350 ms voice-to-voice."""
    low: EagernessLimits = field(default=LOW)
    medium: EagernessLimits = field(default=MEDIUM)
    high: EagernessLimits = field(default=HIGH)

    def __post_init__(self) -> None:
        value = self.score_after_ms
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"score_after_ms must be a non-negative integer number of milliseconds, got {value!r}")
        for eagerness in (Eagerness.LOW, Eagerness.MEDIUM, Eagerness.HIGH):
            limits = self.limits(eagerness)
            if limits.max_wait_ms < value:
                raise ValueError(f"{eagerness.value}.max_wait_ms must be at least score_after_ms ({value})")

    def limits(self, eagerness: Eagerness) -> EagernessLimits:
        resolved = Eagerness(eagerness).resolved()
        return {Eagerness.LOW: self.low, Eagerness.MEDIUM: self.medium, Eagerness.HIGH: self.high}[resolved]


class TurnAction(enum.Enum):
    WAIT = "wait"  # nothing to do until the silence reaches ``TurnDecision.until_ms`` or an answer arrives
    SCORE = "score"  # ask the model now (once per silence run), then decide again
    COMMIT = "commit"  # the turn has ended


@dataclass(frozen=True)
class TurnDecision:
    action: TurnAction
    until_ms: int | None = None
    """For WAIT: the silence length at which to decide again if no answer arrives before (None otherwise)."""


class SemanticPolicy:
    """The policy of one eagerness (see the module docstring). Stateless: the caller keeps, for the current silence
    run, whether it asked and what the model answered, and forgets both when speech resumes."""

    def __init__(self, eagerness: Eagerness | str, config: SemanticVadConfig | None = None) -> None:
        self.eagerness = Eagerness(eagerness)
        self.config = config if config is not None else SemanticVadConfig()
        self.limits = self.config.limits(self.eagerness)

    @property
    def score_after_ms(self) -> int:
        return self.config.score_after_ms

    def end_of_turn_ms(self, probability: float | None) -> int:
        """The silence length (ms) at which the turn ends, given the model's answer (``None``: no answer)."""
        if probability is None:
            return self.limits.unscored_wait_ms
        if not 0.0 <= probability <= 1.0:
            raise ValueError(f"probability must be between 0 and 1, got {probability!r}")
        if probability >= self.limits.complete_at:
            return self.config.score_after_ms
        return self.limits.max_wait_ms

    def decide(self, silence_ms: int, probability: float | None, *, asked: bool) -> TurnDecision:
        """What to do after ``silence_ms`` of silence, given whether the model was asked in this silence run and its
        answer so far."""
        if silence_ms < 0:
            raise ValueError(f"silence_ms must be >= 0, got {silence_ms}")
        if not asked:
            if silence_ms < self.config.score_after_ms:
                return TurnDecision(TurnAction.WAIT, self.config.score_after_ms)
            return TurnDecision(TurnAction.SCORE)
        end = self.end_of_turn_ms(probability)
        if silence_ms >= end:
            return TurnDecision(TurnAction.COMMIT)
        return TurnDecision(TurnAction.WAIT, end)


@dataclass(frozen=True)
class ScoreTurn:
    """Ask the model about the turn's audio as it is now; hand the answer to :meth:`SemanticTurnTracker.scored`
    with this ``run``."""

    run: int


@dataclass(frozen=True)
class EndTurn:
    """The turn ended, ``silence_ms`` into the silence run that followed its speech."""

    silence_ms: int


class SemanticTurnTracker:
    """One session's ``semantic_vad`` over server VAD's silence runs: the policy's decisions applied in order.
    Sans-I/O: the caller measures the silence (on the audio clock), runs the model and reports back.

    Calling order: :meth:`silence` with the current run's length whenever audio arrives while server VAD hears
    silence after speech; :meth:`speech` when speech starts or resumes; :meth:`scored` with the answer to a
    :class:`ScoreTurn` (``None`` for "unknown"); :meth:`unavailable` once the model failed (the session's turns then
    end on silence alone, as with server VAD); :meth:`speech` again after an :class:`EndTurn` to start the next turn.
    An answer for an earlier run (the user spoke meanwhile) is ignored; so is everything after :class:`EndTurn` until
    :meth:`speech`."""

    def __init__(self, policy: SemanticPolicy) -> None:
        self.policy = policy
        self.run = 0
        """The current silence run (counts up; :class:`ScoreTurn` names it)."""
        self._silent = False
        self._asked = False
        self._probability: float | None = None
        self._silence_ms = 0
        self._ended = False
        self._model_available = True

    @property
    def model_available(self) -> bool:
        return self._model_available

    def speech(self) -> None:
        """Speech started or resumed: the silence run (if any) is over; a new turn starts after an ended one."""
        self._silent = False
        self._ended = False

    def silence(self, silence_ms: int) -> list[ScoreTurn | EndTurn]:
        """The current silence run has lasted ``silence_ms`` (from the end of speech)."""
        if self._ended:
            return []
        if not self._silent:
            self._silent = True
            self.run += 1
            self._asked = not self._model_available  # without a model, decide as if it had answered "unknown"
            self._probability = None
        self._silence_ms = silence_ms
        return self._decide()

    def scored(self, run: int, probability: float | None) -> list[EndTurn]:
        """The model's answer to ``ScoreTurn(run)``: P(complete), or None when it had none (saturated)."""
        if run != self.run or not self._silent or self._ended:
            return []
        self._probability = probability
        return [action for action in self._decide() if isinstance(action, EndTurn)]

    def unavailable(self) -> list[EndTurn]:
        """The model failed (:class:`~realtime.turns.smart_turn.TurnModelError`): from now on turns end on silence
        alone. A run waiting for its answer ends as if the answer was "unknown"."""
        self._model_available = False
        if not self._silent or self._ended:
            return []
        self._asked, self._probability = True, None
        return [action for action in self._decide() if isinstance(action, EndTurn)]

    def _decide(self) -> list[ScoreTurn | EndTurn]:
        actions: list[ScoreTurn | EndTurn] = []
        decision = self.policy.decide(self._silence_ms, self._probability, asked=self._asked)
        if decision.action is TurnAction.SCORE:
            self._asked = True
            decision = self.policy.decide(self._silence_ms, None, asked=True)
            if decision.action is not TurnAction.COMMIT:  # an answer could still change the outcome
                actions.append(ScoreTurn(self.run))
        if decision.action is TurnAction.COMMIT:
            self._ended = True
            actions.append(EndTurn(self._silence_ms))
        return actions
