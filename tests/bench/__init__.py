"""The benchmark harness (bench/), run small."""
