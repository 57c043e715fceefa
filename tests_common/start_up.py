"""What a process prints that TensorFlow's own start prints too (a plain
`import tensorflow` does, whatever kerascale does): the rest of its stderr
is what the program (and kerascale in it) said. Issue 55."""

import re

# absl's lines before its InitializeLog, at TensorFlow's import and its
# first device query: oneDNN's notice, the CUDA stub and driver, the CPU
# instructions banner (TF_CPP_MIN_LOG_LEVEL does not reach them in TF 2.21).
_START_UP = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\)"
    r"|[IWE]\d{4} [\d:. ]+\d+ (port|cudart_stub|cuda_platform|cpu_feature_guard)\.cc:"
    r"|To enable the following instructions:"
    r"|rebuild TensorFlow with the appropriate compiler flags)"
)


def said(stderr: str) -> list[str]:
    """The lines of `stderr` that are not TensorFlow's start-up."""
    return [
        line
        for line in stderr.splitlines()
        if line.strip() and not _START_UP.match(line.strip())
    ]
