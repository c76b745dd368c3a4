"""The world that trains is the one the config asks for
(``kiln.core.distributed.launch.check_world_size``).

The SLURM case (``srun --ntasks=1`` with ``trainer.devices=2``) runs on a real cluster in
``tests/experiments/test_slurm.py``.
"""

import lightning as L
import pytest

from kiln.core import TrainerConfig
from kiln.core.distributed.launch import WorldSizeError, check_world_size


def test_one_process_for_two_devices_is_an_error_naming_both_numbers():
    fabric = L.Fabric(accelerator="cpu", devices=1)
    with pytest.raises(WorldSizeError) as error:
        check_world_size(fabric, TrainerConfig(accelerator="cpu", devices=2, num_nodes=1))
    message = str(error.value)
    assert "fabric.world_size=1" in message
    assert "trainer.devices=2 x trainer.num_nodes=1 asks for 2" in message


def test_matching_world_size_passes():
    fabric = L.Fabric(accelerator="cpu", devices=1)
    check_world_size(fabric, TrainerConfig(accelerator="cpu", devices=1))
