from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


@pytest.fixture(scope="session")
def digits_data():
    from edgebnn.data import digits

    return digits(0)


@pytest.fixture(scope="session")
def trained_digits(tmp_path_factory, digits_data):
    """digits_cnn trained once per session (seed 0) and saved as safetensors: (model, weights path)."""
    from safetensors.torch import save_file

    from edgebnn.models import digits_cnn
    from edgebnn.train import train_bnn

    torch.manual_seed(0)
    model = digits_cnn()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # fastest for this small CNN
    try:
        train_bnn(model, digits_data, seed=0, progress=False)
    finally:
        torch.set_num_threads(threads)
    path = tmp_path_factory.mktemp("digits") / "digits_cnn.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return model, path


@pytest.fixture(scope="session")
def digits_ir(trained_digits):
    from edgebnn.importers import import_model

    return import_model(trained_digits[0], (1, 1, 8, 8), where="digits_cnn")
