"""The core: value types every part shares (:mod:`predictive_scaler.core.values`) and the
stable shard assignment (:mod:`predictive_scaler.core.sharding`)."""
