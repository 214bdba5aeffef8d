"""The weekly retraining job: settings, sharding, the history port and its Prometheus
adapter (``history``), the store port and its adapters (``stores``), the training function
the CronJob and the backtest share (``training``), the outcome (``outcome``) and the
CronJob's entry point (``job``). Import each name from the module that defines it.
"""
