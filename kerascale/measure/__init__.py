"""Measure: where a rule can be wrong, find out. The batch-size search (its
pure algorithm, the probes that feed it, the child processes they run in),
the CPU trials, the cache of what was measured, and `decide`, which turns
facts and measurements into the final plan."""
