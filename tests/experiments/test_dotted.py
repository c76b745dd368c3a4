"""kiln.experiments.settings.dotted: the one dotted-key lookup and the one flattening."""

from dataclasses import dataclass

from kiln.experiments.settings.dotted import flatten, select


@dataclass
class Trainer:
    devices: int = 2


def test_select_walks_mappings_and_attributes_and_gives_none_where_a_part_is_missing():
    config = {"trainer": {"devices": 4}, "model": Trainer(), "data": None}
    assert select(config, "trainer.devices") == 4
    assert select(config, "model.devices") == 2
    assert select(config, "trainer.missing") is None
    assert select(config, "data.batch_size") is None
    assert select(config, "trainer.devices.deeper") is None


def test_flatten_joins_the_parts_and_keeps_an_empty_mapping_as_a_value():
    values = {"a": {"b": 1, "c": {"d": 2}}, "e": {}, "f": 3}
    assert flatten(values) == {"a.b": 1, "a.c.d": 2, "e": {}, "f": 3}
    assert flatten({"telemetry": {"recompiles": 0}}, sep="/") == {"telemetry/recompiles": 0}
