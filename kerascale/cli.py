"""The `kerascale` command line.

`kerascale doctor` prints what kerascale sees here and what it would decide for
a model trained on this machine, with the reason for each decision.
`kerascale find-batch MODEL.keras --input-shape 64,64,3` finds the largest
batch a saved model trains at without running out of memory.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Sequence
from typing import Any

# kerascale_cli loads this module and kerascale/_version.py from their files,
# without the package (Keras and its backend), for --help and --version.
from kerascale._version import __version__

# plan.scaling.INTERCONNECTS' kinds (kept here: the parser imports nothing heavy)
INTERCONNECT_KINDS = ("cpu", "gpu", "network", "tpu")


def _doctor(args: argparse.Namespace) -> int:
    if args.cluster:
        return _cluster(args)
    from kerascale.errors import KerascaleError, UnsupportedError
    from kerascale.plan.options import Options
    from kerascale.plan.planner import Planner
    from kerascale.sense import backend as backend_lib
    from kerascale.sense.data_facts import DataFacts
    from kerascale.sense.hardware import detect_hardware
    from kerascale.sense.model_facts import ModelFacts

    hw = detect_hardware()
    # The plan for a typical float32 model trained on arrays, all options "auto".
    try:
        if not backend_lib.supported(hw.backend):
            raise UnsupportedError(backend_lib.unsupported_warning(hw.backend, []))
        plan = Planner(hw, ModelFacts(), DataFacts("arrays"))(Options.validate())
        error = None
    except KerascaleError as e:
        plan, error = None, f"{type(e).__name__}: {e}"
    from kerascale.measure.cache import cache_dir
    from kerascale.sense.environment import environment

    env = {**environment(), "kerascale": __version__, "cache_dir": str(cache_dir())}
    from kerascale._keras_compat import status

    engine = backend_lib.traits(hw.backend).engine
    keras_checked = status.report(tf_distribute=engine == "tf.distribute")
    if args.json:
        report = {
            "version": __version__,
            "environment": env,
            "keras": keras_checked,
            "hardware": hw.to_dict(),
            "default_plan": plan.to_dict() if plan else None,
            "error": error,
        }
        print(json.dumps(report, indent=2))
        return 0
    installed = ", ".join(f"{k} {v}" for k, v in env["versions"].items() if v)
    print(f"kerascale {__version__} on {env['platform']}")
    print(f"versions: {installed}")
    print(f"memory:   {env['memory_available_text']} available")
    print(f"cache:    {env['cache_dir']} (kerascale clear-cache empties it)")
    print(f"hardware: {hw.summary()}")
    print(f"backend:  {hw.backend} (Keras's, from KERAS_BACKEND or keras.json)")
    print(
        f"keras:    {keras_checked['version']}; the suite last passed on "
        f"{', '.join(keras_checked['tested'])}"
        + ("; this one is newer (see below)" if keras_checked["newer"] else "")
    )
    for fix in keras_checked["fixes"]:
        print(
            f"  fix:    {fix['fix']} ({fix['upstream']}): {fix['status']}, {fix['why']}"
        )
    if keras_checked["newer"]:
        print(
            "  note:   a Keras newer than any the suite passed on: kerascale "
            "changes nothing for it, and a resume checks its own data order"
        )
    if hw.cluster is not None:
        c = hw.cluster
        state = f"error: {c.error}" if c.error else f"{c.num_workers} worker(s)"
        print(f"cluster:  {c.source}: {state}")
    for note in hw.notes:
        print(f"note:     {note}")
    print()
    if plan is not None:
        print("Default plan for a float32 model, all options auto:")
        print(plan)
    else:
        print(f"No default plan: {error}")
    print()
    print("For a bug report, paste this output (or `kerascale doctor --json`).")
    return 0


def _cluster(args: argparse.Namespace) -> int:
    """`doctor --cluster N MODEL`: one worker's step timed here, and the step
    predicted at 1 to N data-parallel workers (`plan.scaling`)."""
    from kerascale.diagnose import diagnose
    from kerascale.errors import KerascaleError
    from kerascale.plan import model_sharding as sharding
    from kerascale.plan import scaling

    if not args.model or not args.input_shape:
        print(
            "kerascale: doctor --cluster N times a training step of a saved "
            "model: kerascale doctor --cluster 8 MODEL.keras --input-shape 784",
            file=sys.stderr,
        )
        return 2
    model = _load(args)
    if isinstance(model, int):
        return model
    batch = args.batch_size
    x, y = _synthetic(model, args, batch * 28)
    try:
        measured = diagnose(
            model, x, y, steps=20, batch_size=batch, strategy="default", verbose=0
        )
    except KerascaleError as e:
        print(f"kerascale: {e}", file=sys.stderr)
        return 1
    step = 1.0 / measured.step_batches_per_s
    grads = sum(sharding.variable_bytes(v) for v in model.trainable_variables)
    counts = sorted(
        {1, *(2**i for i in range(1, 31) if 2**i <= args.cluster), args.cluster}
    )
    bandwidth, latency = scaling.INTERCONNECTS[args.link]
    bandwidth = args.bandwidth or bandwidth
    print(
        f"one worker: {step * 1000:.2f} ms a step of {batch} samples (timed "
        f"here); gradients {grads / 1e6:.1f} MB; link {args.link}: "
        f"{bandwidth / 1e9:g} GB/s, {latency * 1e6:g} us a hop"
    )
    print(
        "workers  step ms  all-reduce ms  samples/s  | with accumulation "
        f"x{args.accumulation}: step ms  samples/s"
    )
    for n in counts:
        link = {"kind": args.link, "bandwidth": args.bandwidth}
        plain = scaling.estimate(step, batch, grads, n, **link)
        acc = scaling.estimate(
            step, batch, grads, n, accumulation=args.accumulation, **link
        )
        print(
            f"{n:>7}  {plain.step_seconds * 1000:>7.2f}  "
            f"{plain.allreduce_seconds * 1000:>13.2f}  "
            f"{plain.samples_per_second:>9.0f}  | {acc.step_seconds * 1000:>26.2f}  "
            f"{acc.samples_per_second:>9.0f}"
        )
    print(
        "(a ring all-reduce after each update, not overlapped with the step: "
        "kerascale/plan/scaling.py; measured against 1, 2 and 4 devices in "
        "benchmarks/README.md)"
    )
    return 0


def _clear_cache(args: argparse.Namespace) -> int:
    from kerascale.measure import cache

    removed = cache.clear()
    print(
        f"kerascale: removed {removed} cached measurement(s) from {cache.cache_dir()}"
    )
    return 0


def _load(args: argparse.Namespace) -> Any:
    """The saved model of `args.model`, or an exit code after a message."""
    import importlib

    import keras

    for module in args.imports:
        importlib.import_module(module)  # registers the model's custom objects
    try:
        with warnings.catch_warnings():
            # A model saved before training has an unbuilt optimizer; Keras
            # warns that it skips its variables, which is harmless here.
            warnings.filterwarnings("ignore", "Skipping variable loading")
            return keras.saving.load_model(args.model)
    except Exception as e:
        print(
            f"kerascale: cannot load {args.model}: {type(e).__name__}: {e}",
            file=sys.stderr,
        )
        return 2


def _synthetic(model: Any, args: argparse.Namespace, count: int) -> Any:
    """(x, y): `count` synthetic samples shaped like --input-shape, with
    targets shaped like the model's outputs (class indices for a sparse
    loss): a `tf.data.Dataset` (and None) on TensorFlow, arrays elsewhere."""
    import keras
    import numpy as np

    from kerascale.sense import backend as backend_lib

    shapes = [_shape(s) for s in args.input_shape]
    sample = [np.zeros((1, *shape), args.input_dtype) for shape in shapes]
    inputs = sample[0] if len(sample) == 1 else sample
    outputs = model(inputs)
    loss = str(getattr(model, "loss", "")).lower()
    if not backend_lib.traits().feeds_datasets:
        # Arrays (no TensorFlow needed): one sample seen `count` times through
        # a read-only view, without holding that many samples in memory.
        def many(shape: tuple[int, ...], dtype: Any) -> Any:
            return np.broadcast_to(np.zeros(shape, dtype), (count, *shape))

        sparse = "sparse" in loss
        x = [many(a.shape[1:], a.dtype) for a in sample]
        y = keras.tree.map_structure(
            lambda out: many(
                tuple(out.shape[1:-1] if sparse else out.shape[1:]),
                "int64" if sparse else "float32",
            ),
            outputs,
        )
        return (x[0] if len(x) == 1 else tuple(x)), y

    import tensorflow as tf

    def target(out):
        if "sparse" in loss:  # class indices, one per sample
            return tf.zeros(out.shape[1:-1], tf.int64)
        return tf.zeros(out.shape[1:], tf.float32)

    element = (
        tuple(tf.constant(a[0]) for a in sample)
        if len(sample) > 1
        else tf.constant(sample[0][0]),
        tf.nest.map_structure(target, outputs),
    )
    # One sample repeated: a dataset of the size asked for, without holding
    # that many samples in memory.
    return tf.data.Dataset.from_tensors(element).repeat(count), None


def _find_batch(args: argparse.Namespace) -> int:
    from kerascale.errors import KerascaleError
    from kerascale.find_batch import find_batch_size

    model = _load(args)
    if isinstance(model, int):
        return model
    x, y = _synthetic(model, args, args.max_batch_size)
    try:
        result = find_batch_size(
            model,
            x,
            y,
            mode=args.mode,
            memory_limit=args.memory_limit,
            max_batch_size=args.max_batch_size,
            precision=args.precision,
            cache=not args.no_cache,
            remeasure=args.remeasure,
            verbose=0 if args.json else "auto",
        )
    except KerascaleError as e:
        print(f"kerascale: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        print(result)
    return 0


def _diagnose(args: argparse.Namespace) -> int:
    from kerascale.diagnose import diagnose
    from kerascale.errors import KerascaleError

    model = _load(args)
    if isinstance(model, int):
        return model
    batch = args.batch_size or 32
    x, y = _synthetic(model, args, batch * (args.steps + 8))
    try:
        result = diagnose(
            model,
            x,
            y,
            steps=args.steps,
            batch_size=args.batch_size or "auto",
            precision=args.precision,
            memory_limit=args.memory_limit,
            remeasure=args.remeasure,
            verbose=0 if args.json else "auto",
        )
    except KerascaleError as e:
        print(f"kerascale: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result.to_dict(), indent=2, default=str))
    else:
        print(result)
    return 0


def _shape_arg(text: str) -> str:
    _shape(text)  # validated here, parsed again where it is used
    return text


def _shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(d) for d in text.split(",") if d.strip())
    except ValueError:
        dims = ()
    if not dims or any(d < 1 for d in dims):
        raise argparse.ArgumentTypeError(
            f"--input-shape must be positive ints separated by commas, e.g. "
            f"64,64,3. Received: {text!r}"
        )
    return dims


def _size(text: str) -> str:
    from kerascale._units import parse_bytes
    from kerascale.errors import ConfigurationError

    try:
        parse_bytes("--memory-limit", text)
    except ConfigurationError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive int. Received: {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kerascale",
        description="Train Keras models at the scale of the hardware here.",
    )
    parser.add_argument(
        "--version", action="version", version=__version__, help="print the version"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    _add_doctor(sub)
    clear = sub.add_parser(
        "clear-cache",
        help=(
            "forget every measurement kerascale cached (batch searches, trials, "
            "the bf16 reference step, JAX's sharding decisions)"
        ),
    )
    clear.set_defaults(func=_clear_cache)
    _add_find_batch(sub)
    _add_diagnose(sub)
    return parser


def _model_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments that describe a saved model's inputs and training."""
    p.add_argument(
        "--input-shape",
        action="append",
        required=True,
        type=_shape_arg,
        metavar="D1,D2,...",
        help="per-sample input shape; repeat for several inputs",
    )
    p.add_argument("--input-dtype", default="float32", help="the inputs' dtype")
    p.add_argument(
        "--memory-limit",
        type=_size,
        default=None,
        help='e.g. "4GiB"; per GPU, or the resident memory (RSS) on CPU',
    )
    p.add_argument(
        "--precision",
        default="auto",
        choices=["auto", "float32", "mixed_float16", "mixed_bfloat16"],
        help="the precision to measure under (auto: what fit would pick)",
    )
    p.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE first (registers custom objects)",
    )


def _add_doctor(sub: Any) -> None:
    doctor = sub.add_parser(
        "doctor", help="show the detected hardware and the default decisions"
    )
    doctor.add_argument("--json", action="store_true", help="print JSON")
    doctor.add_argument(
        "--cluster",
        type=_positive,
        default=None,
        metavar="N",
        help="predict the step at 1 to N data-parallel workers (needs MODEL)",
    )
    doctor.add_argument("model", nargs="?", help="with --cluster: a saved model")
    doctor.add_argument(
        "--input-shape",
        action="append",
        type=_shape_arg,
        metavar="D1,D2,...",
        help="with --cluster: per-sample input shape; repeat for several inputs",
    )
    doctor.add_argument(
        "--input-dtype", default="float32", help="with --cluster: the inputs' dtype"
    )
    doctor.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE first (registers custom objects)",
    )
    doctor.add_argument("--batch-size", type=_positive, default=32, help="per worker")
    doctor.add_argument(
        "--link",
        choices=sorted(INTERCONNECT_KINDS),
        default="network",
        help="with --cluster: what connects the workers",
    )
    doctor.add_argument("--bandwidth", type=float, default=None, help="bytes/s a link")
    doctor.add_argument(
        "--accumulation",
        type=_positive,
        default=4,
        help="with --cluster: micro-batches per update in the estimate",
    )
    doctor.set_defaults(func=_doctor)


def _add_find_batch(sub: Any) -> None:
    find = sub.add_parser(
        "find-batch",
        help="find the largest batch a saved model trains at without OOM",
        description="Probes real training steps of MODEL.keras on synthetic "
        "inputs of --input-shape (in child processes on CPU, in this one on "
        "GPU), and reports the "
        "largest batch that fits (or, with --mode throughput, the fastest).",
    )
    find.add_argument("model", help="a model saved with model.save('....keras')")
    _model_arguments(find)
    find.add_argument(
        "--max-batch-size",
        type=_positive,
        default=4096,
        help="the largest global batch to consider",
    )
    find.add_argument(
        "--mode",
        choices=["max", "throughput"],
        default="max",
        help="the largest batch that fits, or the fastest",
    )
    find.add_argument(
        "--no-cache", action="store_true", help="neither read nor write the cache"
    )
    find.add_argument(
        "--remeasure",
        "--force",
        dest="remeasure",
        action="store_true",
        help="search anew, ignoring a cached result (--force: its old name)",
    )
    find.add_argument("--json", action="store_true", help="print JSON")
    find.set_defaults(func=_find_batch)


def _add_diagnose(sub: Any) -> None:
    diag = sub.add_parser(
        "diagnose",
        help="say whether training a saved model is input-, compute- or memory-bound",
        description="Times the input pipeline alone, a training step alone and "
        "both together for MODEL.keras on synthetic inputs of --input-shape "
        "(plus memory at the batch, with --memory-limit), and says what to change.",
    )
    diag.add_argument("model", help="a model saved with model.save('....keras')")
    _model_arguments(diag)
    diag.add_argument(
        "--batch-size",
        type=_positive,
        default=None,
        help="the global batch to measure (default: what fit would pick)",
    )
    diag.add_argument(
        "--steps", type=_positive, default=20, help="training steps to time"
    )
    diag.add_argument(
        "--remeasure",
        "--force",
        dest="remeasure",
        action="store_true",
        help="measure again, ignoring the cache (--force: its old name)",
    )
    diag.add_argument("--json", action="store_true", help="print JSON")
    diag.set_defaults(func=_diagnose)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
