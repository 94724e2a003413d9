"""pytorch/examples' regression program (regression/main.py): a linear model fitted to a random
polynomial of degree 4 by SGD on the smooth L1 loss, batch 32, written afresh with its step as it
is there (a fresh batch, zero_grad, the loss, .item(), backward, and the update in place). The
update is written ``with torch.no_grad(): param.add_(...)``, today's spelling of the original's
``param.array.add_(...)`` (minidl's ``.array`` is the array itself: docs/pytorch.md)."""
import torch
import torch.nn.functional as F

POLY_DEGREE = 4


def make_features(x):
    """Builds features i.e. a matrix with columns [x, x^2, x^3, x^4]."""
    x = x.unsqueeze(1)
    return torch.cat([x ** i for i in range(1, POLY_DEGREE + 1)], 1)


def make_step(seed=0):
    torch.manual_seed(seed)
    W_target = torch.randn(POLY_DEGREE, 1) * 5
    b_target = torch.randn(1) * 5

    def f(x):
        return x.mm(W_target) + b_target.item()

    def get_batch(batch_size=32):
        random = torch.randn(batch_size)
        x = make_features(random)
        y = f(x)
        return x, y

    fc = torch.nn.Linear(W_target.size(0), 1)

    def step():
        batch_x, batch_y = get_batch()
        fc.zero_grad()
        output = F.smooth_l1_loss(fc(batch_x), batch_y)
        loss = output.item()
        output.backward()
        with torch.no_grad():
            for param in fc.parameters():
                param.add_(-0.1 * param.grad)
        return loss
    return step


def make_traced_step(seed=0, compile=lambda f: f):  # noqa: A002 - the tracer to apply, e.g. minidl.compile
    """The same training as ``make_step`` in the form a tracer takes: the update of a function of the
    batch (drawn outside it: the batch maker calls ``.item()``), with ``optim.SGD`` doing the
    update (p − 0.1·g, the same numbers as ``param.add_(-0.1 * param.grad)``), and the loss
    returned as a tensor. ``compile`` wraps that function (the identity: the eager step)."""
    torch.manual_seed(seed)
    W_target = torch.randn(POLY_DEGREE, 1) * 5
    b_target = torch.randn(1) * 5
    bias = b_target.item()

    def get_batch(batch_size=32):
        x = make_features(torch.randn(batch_size))
        return x, x.mm(W_target) + bias

    fc = torch.nn.Linear(W_target.size(0), 1)
    opt = torch.optim.SGD(fc.parameters(), lr=0.1)

    @compile
    def train(batch_x, batch_y):
        fc.zero_grad()
        output = F.smooth_l1_loss(fc(batch_x), batch_y)
        output.backward()
        opt.step()
        return output

    def step():
        return train(*get_batch())
    return step
