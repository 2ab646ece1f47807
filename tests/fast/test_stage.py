"""fast.stage.Stage: the protocol's defaults -- state nests the upstream's, reset and close go upstream."""

from __future__ import annotations

from fastload.fast.stage import Stage


class Counter(Stage):
    """A source stage: counts from where its state says; records what it was told."""

    def __init__(self):
        self.n, self.resets, self.closed = 0, [], False

    def __next__(self):
        self.n += 1
        return self.n

    def state(self):
        return {"n": self.n}

    def reset(self, state=None):
        self.resets.append(state)
        self.n = 0 if state is None else state["n"]

    def close(self):
        self.closed = True


class Pass(Stage):
    """A stage that keeps nothing of its own: every protocol method is Stage's default."""

    def __init__(self, source):
        self.source = source

    def __next__(self):
        return next(self.source)


def test_state_nests_each_upstream_under_source():
    chain = Pass(Pass(Counter()))
    assert [next(chain) for _ in range(3)] == [1, 2, 3]
    assert chain.state() == {"source": {"source": {"n": 3}}}


def test_reset_hands_each_upstream_its_own_part_of_the_state():
    counter = Counter()
    chain = Pass(Pass(counter))
    chain.reset({"source": {"source": {"n": 10}}})
    assert counter.resets == [{"n": 10}] and next(chain) == 11
    chain.reset()  # None: start over from where the upstream starts
    assert counter.resets[-1] is None and next(chain) == 1
    chain.reset({})  # a state saved without an upstream part
    assert counter.resets[-1] is None


def test_a_saved_state_restores_the_same_stream():
    chain = Pass(Counter())
    for _ in range(4):
        next(chain)
    saved = chain.state()
    after = [next(chain) for _ in range(3)]
    chain.reset(saved)
    assert [next(chain) for _ in range(3)] == after


def test_close_reaches_the_source():
    counter = Counter()
    Pass(Pass(counter)).close()
    assert counter.closed


def test_an_upstream_that_is_no_stage_is_left_alone():
    """A plain iterator (or nothing) upstream: no state of its own, reset and close do not touch it."""
    it = iter([1, 2, 3])
    stage = Pass(it)
    assert stage.state() == {} and Stage().state() == {}
    stage.reset({"source": {"n": 1}})
    stage.close()
    Stage().reset()
    Stage().close()
    assert iter(stage) is stage and next(stage) == 1
