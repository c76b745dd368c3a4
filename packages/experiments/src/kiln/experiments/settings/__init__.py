"""The Python side of kiln's Hydra configs: where they live, their dataclasses, resolvers and
callbacks, and the module a resolved config describes."""
