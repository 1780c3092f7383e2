"""Benchmarks: this broker and Tansu side by side under the same librdkafka load.

Run ``python -m bench`` (or ``make bench``); ``python -m bench --help`` lists the options
and ``python -m bench.profile`` profiles this broker under the produce load with py-spy.
"""
