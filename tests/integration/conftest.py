from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny torch ops: intra-op threads spin on a shared CPU (thread start-up dominates thousands of forwards of
    these small models; 50x slower at 2 threads). Modules that need it: ``pytestmark = usefixtures(...)``."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


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


# -- the posterior families, trained or fitted once per session and shared by the test files that need them ---------
# (each a few seconds; a test that changes a network deep-copies it first: laplace-torch's backends hook the modules)


def _digits_mlp(seed: int):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))


@pytest.fixture(scope="session")
def digits_mlps(digits_data):
    """A deep ensemble: 3 digits MLPs 64-32-10 from seeds 0, 1, 2 (Adam 1e-2, 40 full-batch steps: test accuracy
    ~0.9), in eval mode. Member 0 is the MAP network of the Laplace fits."""
    x, y = torch.from_numpy(digits_data.x_train), torch.from_numpy(digits_data.y_train)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # fastest for these small MLPs on a shared machine
    try:
        members = []
        for seed in range(3):
            net = _digits_mlp(seed)
            opt = torch.optim.Adam(net.parameters(), 1e-2)
            for _ in range(40):
                opt.zero_grad()
                torch.nn.functional.cross_entropy(net(x), y).backward()
                opt.step()
            members.append(net.eval())
    finally:
        torch.set_num_threads(threads)
    return members


def _laplace_fit(net, digits_data, weights: str, structure: str):
    import copy

    laplace = pytest.importorskip("laplace")
    x, y = torch.from_numpy(digits_data.x_train[:400]), torch.from_numpy(digits_data.y_train[:400])
    la = laplace.Laplace(copy.deepcopy(net), "classification", subset_of_weights=weights, hessian_structure=structure,
                         prior_precision=1.0)
    la.fit(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=512))  # 400 images: ~1 s
    return la


@pytest.fixture(scope="session")
def laplace_kron_ll(digits_mlps, digits_data):
    """laplace-torch's last-layer Kronecker Laplace of the MAP network (digits_mlps[0]; prior precision 1, fitted
    on 400 training images)."""
    return _laplace_fit(digits_mlps[0], digits_data, "last_layer", "kron")


@pytest.fixture(scope="session")
def laplace_diag_all(digits_mlps, digits_data):
    """laplace-torch's diagonal Laplace over all weights of the MAP network (as :func:`laplace_kron_ll`)."""
    return _laplace_fit(digits_mlps[0], digits_data, "all", "diag")


SWAG_K = 10  # deviations kept


@pytest.fixture(scope="session")
def swag_digits(digits_data):
    """(model, stats {name}_mean/_sq_mean/_covariance_sqrt): a digits MLP 64-32-10 trained with SGD (momentum 0.9,
    batches of 64) for 4 epochs, then SWAG_K more epochs collecting the reference code's running moments and the
    last SWAG_K deviations (SWAG.collect_model)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # fastest for this small MLP on a shared machine
    try:
        model = _digits_mlp(0)
        xtr, ytr = (torch.from_numpy(a) for a in digits_data.split("train"))
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        g = torch.Generator().manual_seed(0)
        params = dict(model.named_parameters())
        mean = {n: torch.zeros_like(p) for n, p in params.items()}
        sq = {n: torch.zeros_like(p) for n, p in params.items()}
        dev: dict = {n: [] for n in params}
        for epoch in range(4 + SWAG_K):
            perm = torch.randperm(len(xtr), generator=g)
            for i in range(0, len(xtr), 64):
                idx = perm[i:i + 64]
                loss = torch.nn.functional.cross_entropy(model(xtr[idx]), ytr[idx])
                opt.zero_grad()
                loss.backward()
                opt.step()
            if epoch >= 4:  # collect_model: running moments, then the deviation from the new mean
                n_models = epoch - 4
                for n, p in params.items():
                    w = p.detach()
                    mean[n] = mean[n] * n_models / (n_models + 1) + w / (n_models + 1)
                    sq[n] = sq[n] * n_models / (n_models + 1) + w**2 / (n_models + 1)
                    dev[n] = (dev[n] + [(w - mean[n]).reshape(-1)])[-SWAG_K:]
    finally:
        torch.set_num_threads(threads)
    stats = {}
    for n in params:
        stats[f"{n}_mean"], stats[f"{n}_sq_mean"] = mean[n], sq[n]
        stats[f"{n}_covariance_sqrt"] = torch.stack(dev[n])
    return model.eval(), stats
