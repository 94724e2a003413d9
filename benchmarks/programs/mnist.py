"""pytorch/examples' MNIST program (mnist/main.py): two convolutions, max pooling, dropout, two
linear layers, log_softmax and nll_loss, Adadelta at lr 1.0, batch 64, written afresh; the images
are random (normalized as the program normalizes MNIST's), since only the step's time is measured."""
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim

BATCH = 64


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = self.conv1(x)
        x = F.relu(x)
        x = self.conv2(x)
        x = F.relu(x)
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = self.fc1(x)
        x = F.relu(x)
        x = self.dropout2(x)
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)


def _setup(seed):
    """The network, its Adadelta optimizer and four batches of random images, drawn from ``seed`` in this order."""
    torch.manual_seed(seed)
    model = Net()
    model.train()
    optimizer = optim.Adadelta(model.parameters(), lr=1.0)
    batches = [((torch.rand(BATCH, 1, 28, 28) - 0.1307) / 0.3081, torch.randint(0, 10, (BATCH,))) for _ in range(4)]
    return model, optimizer, batches


def make_step(seed=0):
    model, optimizer, batches = _setup(seed)
    state = {"i": 0}

    def step():
        data, target = batches[state["i"] % len(batches)]
        state["i"] += 1
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        return loss
    return step


def make_traced_step(seed=0, compile=lambda f: f):  # noqa: A002 - the tracer to apply, e.g. minidl.compile
    """``make_step``'s training in the form a tracer takes: the update as a function of the batch
    (drawn outside it), returning the loss. The loss is ``cross_entropy`` of the network's
    log-probabilities: minidl's ``nll_loss`` builds its index from the targets outside an op, which
    minidl.compile refuses; log_softmax is idempotent, so this is nll_loss's value up to rounding,
    for one more log_softmax over a (64, 10) array."""
    model, optimizer, batches = _setup(seed)
    state = {"i": 0}

    @compile
    def train(data, target):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()
        return loss

    def step():
        data, target = batches[state["i"] % len(batches)]
        state["i"] += 1
        return train(data, target)
    return step
