"""Optional dependencies fail with the extra that installs them."""

import pytest

from kiln.core.optional import require


def test_require_returns_the_module() -> None:
    assert require("json", "kiln-core").dumps([1]) == "[1]"


def test_require_names_the_extra_when_missing() -> None:
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'kiln-models\[examples\]'"):
        require("kiln_no_such_module", "kiln-models[examples]")
