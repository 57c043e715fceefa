"""A CPU search's batches probed in this process while their steps are far
below the memory limit, and in child processes beyond
(kerascale/measure/headroom.py): the guard through a deterministic seam,
then for real."""

import keras
from test_batch_search import probe_dirs_made, spec_for, toy_data  # noqa: F401

import kerascale
from kerascale.measure import headroom, placement, probe_memory
from kerascale.measure.result import OK, ProbeResult

MiB = 2**20


class Here:
    """In this process, deterministically: each batch grows `per_sample`
    bytes a sample over `base`, and the prober honours `admit` as
    `InProcessProber.sweep` does."""

    def __init__(self, base, per_sample):
        self.base, self.per_sample, self.ran = base, per_sample, []

    def sweep(self, batches, admit=lambda b, done: True):
        done = []
        for b in batches:
            if not admit(b, done):
                break
            self.ran.append(b)
            done.append(ProbeResult(b, OK, peak_bytes=self.base + self.per_sample * b))
        return done

    def __exit__(self, *exc):
        pass


class Children:
    def __init__(self):
        self.ran, self.entered, self.exited = [], 0, 0

    def __enter__(self):
        self.entered += 1
        return self

    def __exit__(self, *exc):
        self.exited += 1

    def sweep(self, batches):
        self.ran += batches
        return [ProbeResult(b, OK, peak_bytes=1) for b in batches]


def guarded(here, limit, prior, monkeypatch, base):
    monkeypatch.setattr(headroom.memory, "resident_bytes", lambda: base)
    children = Children()
    prober = headroom.HeadroomProber(here, limit, prior, lambda: children)
    return prober, children


def test_batches_run_here_while_twice_their_growth_is_under_a_quarter_of_the_limit(
    monkeypatch,
):
    """1 MiB a sample measured, a prior of less: with a 1 GiB limit, a batch
    runs here while 2 x its growth <= 256 MiB, i.e. up to 128 samples."""
    here = Here(base=500 * MiB, per_sample=MiB)
    prober, children = guarded(here, 1024 * MiB, (0, MiB // 4), monkeypatch, 500 * MiB)
    with prober:
        results = prober.sweep([32, 64, 128, 256, 512])
    assert here.ran == [32, 64, 128]
    assert children.ran == [256, 512] and children.entered == 1
    assert [r.batch for r in results] == [32, 64, 128, 256, 512]
    # Once in children, the search stays there.
    with prober:
        prober.sweep([1024])
    assert children.ran == [256, 512, 1024] and here.ran == [32, 64, 128]
    assert children.exited == 2
    assert prober.where() == (
        "in this process up to batch 128, in child processes beyond (a step "
        "nearer the memory limit)",
        True,
    )


def test_the_prior_alone_can_send_the_first_batch_to_children(monkeypatch):
    """A model whose weights alone are predicted over an eighth of the limit
    never trains here, not even at the first batch."""
    here = Here(base=0, per_sample=0)
    prober, children = guarded(here, 800 * MiB, (101 * MiB, 0), monkeypatch, 0)
    with prober:
        prober.sweep([32, 64])
    assert here.ran == [] and children.ran == [32, 64]
    assert prober.where() == ("each probe in a child process", True)


def test_a_measured_batch_outweighs_a_small_prior(monkeypatch):
    """The prior predicts 32 KiB a sample; the batch of 32 measured 4 MiB a
    sample, so 64 (predicted 256 MiB, twice that over a quarter of 1 GiB)
    goes to a child."""
    here = Here(base=0, per_sample=4 * MiB)
    prober, children = guarded(here, 1024 * MiB, (0, 32 * 1024), monkeypatch, 0)
    with prober:
        prober.sweep([32, 64])
    assert here.ran == [32] and children.ran == [64]


def test_all_here_when_every_step_is_small(monkeypatch):
    here = Here(base=0, per_sample=1024)
    prober, children = guarded(here, 8 * 1024 * MiB, (MiB, 1024), monkeypatch, 0)
    with prober:
        prober.sweep([32, 64, 128])
    assert here.ran == [32, 64, 128] and children.entered == 0
    assert prober.where()[1] is False


def mlp(width=64):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(width, activation="relu")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(2)(hidden))
    model.compile("adam", "sparse_categorical_crossentropy")
    return model


def test_the_prior_counts_weights_and_every_layer_output():
    model = mlp()
    fixed, per_sample = placement.prior_for(model)
    assert fixed == placement.PARAM_BYTES * (4 * 64 + 64 + 64 * 2 + 2)
    # Input (4), Dense (64), Dense (2): every symbolic output a sample.
    assert per_sample == placement.OUTPUT_BYTES * (4 + 64 + 2)

    class Subclassed(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(2)

        def call(self, x):
            return self.dense(x)

    assert placement.prior_for(Subclassed()) is None  # no shapes: children


def test_a_small_model_throughput_search_starts_no_process(
    probe_dirs_made,  # noqa: F811
    monkeypatch,
):
    """For real: without memory_limit, a small model's CPU speed ladder runs
    in this process, and says so; no child process's directory is made. Its
    probes skip the validation step (a trace a batch, for memory that cannot
    matter this far below the limit)."""
    from kerascale.measure import probe

    specs, real = [], probe.InProcessProber.__init__

    def recording(self, model, spec, **kwargs):
        specs.append(spec)
        real(self, model, spec, **kwargs)

    monkeypatch.setattr(probe.InProcessProber, "__init__", recording)
    x, y = toy_data(256)
    found = kerascale.find_batch_size(
        mlp(),
        x,
        y,
        mode="throughput",
        max_batch_size=128,
        precision="float32",
        cache=False,
        verbose=0,
    )
    assert found.reasons["isolate"].code == "isolate.far_below"
    measured = found.reasons["memory"].details["measured"]
    assert measured.startswith("resident memory (RSS) of this process")
    assert probe_dirs_made == []
    assert [(s.validate, s.memory_limit) for s in specs] == [(False, None)]
    assert {p.outcome for p in found.probes} == {OK}
    assert 32 <= found.batch_size <= 128


def test_a_machine_with_little_memory_sends_the_larger_steps_to_children(
    monkeypatch,
    probe_dirs_made,  # noqa: F811
):
    """For real, but for the machine's free memory (the seam): with 4 GiB
    available, the limit is 3.2 GiB and a batch runs here only while twice
    its growth stays under 819 MiB; a 131072-wide layer's batches from 256
    up (its prior: 2 MiB a sample) go to child processes."""
    monkeypatch.setattr(probe_memory, "available_bytes", lambda: 4096 * MiB)
    x, y = toy_data(256)
    found = kerascale.find_batch_size(
        mlp(131072),
        x,
        y,
        mode="throughput",
        max_batch_size=256,
        precision="float32",
        cache=False,
        verbose=0,
    )
    why = found.reasons["isolate"]
    assert why.startswith("in this process up to batch "), why
    assert "in child processes beyond" in why
    assert probe_dirs_made  # the children ran
    assert [p.outcome for p in found.probes][:2] == [OK, OK]
    assert found.batch_size >= 32


def test_a_memory_limit_keeps_every_probe_in_children(probe_dirs_made):  # noqa: F811
    """Where the user gave a memory limit (a child's memory is measured
    exactly), nothing runs here."""
    x, y = toy_data(256)
    found = kerascale.find_batch_size(
        mlp(),
        x,
        y,
        mode="throughput",
        max_batch_size=32,
        memory_limit="4GiB",
        precision="float32",
        cache=False,
        verbose=0,
    )
    assert found.reasons["isolate"].code == "isolate.children"
    assert probe_dirs_made


def test_a_throughput_search_gets_a_room_only_where_the_guard_applies():
    """A search's `Room` (the limit and the model's prior) is what lets its
    first batches run here: a throughput search on one CPU device, without
    memory_limit, against a known limit; no other."""
    import types

    model = mlp(1024)  # the prior: 16 x 1030 bytes a sample, 16 x 7170 fixed
    cpu = types.SimpleNamespace(
        accelerator="cpu", cpu=types.SimpleNamespace(logical_devices=1)
    )
    plan = types.SimpleNamespace(devices=("/cpu:0",))
    auto = types.SimpleNamespace(isolate="auto", memory_limit=None)
    top = 1024
    need = int(placement.SAFETY / placement.SHARE * 16 * (7170 + 1030 * top))

    def room(mode="throughput", options=auto, limit=need, hw=cpu):
        placed = placement.place(model, hw, plan, options, None, mode=mode, limit=limit)
        assert placed.in_children and placed.forked
        return placed.room

    assert room() == placement.Room(need, placement.prior_for(model))
    assert room(limit=need - 1).limit == need - 1
    assert room(mode="max") is None
    assert (
        room(options=types.SimpleNamespace(isolate="auto", memory_limit=need)) is None
    )
    assert room(limit=None) is None
    two = types.SimpleNamespace(
        accelerator="cpu", cpu=types.SimpleNamespace(logical_devices=2)
    )
    assert room(hw=two) is None


def test_an_unbuilt_model_has_no_prior():
    """Without shapes nothing is predicted, so nothing trains here."""
    model = keras.Sequential([keras.layers.Dense(8), keras.layers.Dense(2)])
    assert placement.prior_for(model) is None


def test_a_sweep_here_trains_its_batches_on_one_clone(monkeypatch):
    """One clone (one trace) for a sweep's batches, as in a child; a batch
    that fails after others is probed again alone, on a clone of its own."""
    import tensorflow as tf

    from kerascale.measure import probe

    class FailsAbove(keras.layers.Layer):
        def call(self, x):
            tf.debugging.assert_less_equal(tf.shape(x)[0], 16)
            return x

    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(2)(FailsAbove()(inputs)))
    model.compile("sgd", "sparse_categorical_crossentropy")
    built, real = [], probe.build_probe_model

    def counting(*args, **kwargs):
        built.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(probe, "build_probe_model", counting)
    prober = probe.InProcessProber(model, spec_for(*toy_data(64), validate=False))
    assert [r.outcome for r in prober.sweep([4, 8, 16])] == [OK, OK, OK]
    assert len(built) == 1
    results = prober.sweep([8, 32, 64])
    assert [r.outcome for r in results] == [OK, "error"]  # stops at the first
    assert "InvalidArgument" in results[-1].message
    assert len(built) == 3  # the sweep's clone, and 32's alone


def test_a_batch_here_reports_what_it_adds_where_children_do(monkeypatch):
    """Where the limit is a share of the memory free now (no memory_limit),
    a child reports what its batch adds: so does a batch in this process,
    so that one table reads alike (issue 55: 745-780 MiB here beside 99-282
    MiB from children); where this process's memory counts, as it is."""
    base = 700 * MiB
    for as_growth, first in ((True, 5 * MiB), (False, base + 5 * MiB)):
        here = Here(base=base, per_sample=MiB)
        monkeypatch.setattr(headroom.memory, "resident_bytes", lambda: base)
        prober = headroom.HeadroomProber(
            here, 10 << 30, (0, MiB), Children, as_growth=as_growth
        )
        with prober:
            (r,) = prober.sweep([5])
        assert r.peak_bytes == first
