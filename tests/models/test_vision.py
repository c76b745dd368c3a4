import pytest
import timm
import torch

import kiln.models as km
from kiln.models.data import ImageClassificationData
from kiln.models.testing import tiny_model
from kiln.models.vision import TINY_RESNET


def test_image_size_the_model_cannot_take_fails_before_training():
    data = ImageClassificationData(img_size=48)
    with pytest.raises(
        ValueError, match=r"'vit_tiny_patch16_224' cannot take images of size \(3, 48, 48\)"
    ):
        km.create_model("vit-tiny", data=data)  # built for 32x32
    with pytest.raises(ValueError, match=r"cannot take images of size \(3, 32, 32\)"):
        km.create_model(
            "timm", arch="vit_tiny_patch16_224", img_size=None, data=data.__class__(img_size=32)
        )
    resnet = km.create_model("resnet-tiny", data=ImageClassificationData(img_size=24))
    assert resnet.data_module.data_config["input_size"] == (3, 24, 24)  # CNNs take any size
    with pytest.raises(ValueError, match="not a timm model"):
        km.create_model("timm", arch="resnet_does_not_exist")


def test_pretrained_weights_from_a_local_file(tmp_path):
    source = timm.create_model("resnet18", num_classes=10, **TINY_RESNET)
    torch.save(source.state_dict(), tmp_path / "weights.pth")
    module = tiny_model("resnet-tiny", pretrained=str(tmp_path / "weights.pth"), num_classes=10)
    for key, value in source.state_dict().items():
        if key.startswith("fc."):
            continue  # timm re-initializes the head when num_classes differs from the cfg's
        torch.testing.assert_close(module.model.state_dict()[key], value)
    with pytest.raises(FileNotFoundError, match=r"missing.pth"):
        tiny_model("resnet-tiny", pretrained=str(tmp_path / "missing.pth"))


def test_timm_transforms_follow_the_model_data_config():
    module = tiny_model("vit-tiny")
    assert module.data_config["input_size"] == (3, 32, 32)
    assert module.data_config["mean"] == (0.5, 0.5, 0.5)  # ViT's config, not ImageNet's
    assert tiny_model("resnet-tiny").data_config["mean"] == (0.485, 0.456, 0.406)
