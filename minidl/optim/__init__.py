"""Optimizers, learning-rate schedules, and training-curvature tools.

Every optimizer is its update equation written as a plain function of arrays
(``sgd_update``, ``adam_update``...; the docstrings give the equations and the
papers) plus a small class that keeps its state:

    opt = optim.Adam(model.parameters(), lr=1e-3)
    loss.backward();  opt.step();  opt.zero_grad()

Family by family: ``sgd`` (SGD, NAG, SGDM), ``adaptive`` (AdaGrad, RMSProp,
AdaDelta), ``adam`` (Adam, AdamW, AMSGrad, NAdam, RAdam), ``layerwise``
(LARS, LAMB, NovoGrad), ``adahessian``, ``averaging`` (Lookahead, SWA,
Ranger, RangerLARS), ``switch`` (SwitchOptimizer: Adam, then SGD with
momentum, SWATS), ``lbfgs`` (LBFGS: the quasi-Newton two-loop recursion with
PyTorch's strong-Wolfe line search, stepped with a closure). ``schedules`` holds the learning-rate schedules,
``lr_finder`` the learning-rate range test, ``curvature`` Hessian tools and
the gradient noise scale.
"""
from minidl.nn.utils import clip_grad_norm_, clip_grad_value_  # PyTorch keeps them in nn.utils; here too for the book
from minidl.optim import lr_scheduler, schedules
from minidl.optim.adahessian import AdaHessian
from minidl.optim.adam import Adam, AdamW, AMSGrad, NAdam, RAdam
from minidl.optim.adaptive import AdaDelta, Adadelta, AdaGrad, Adagrad, RMSProp, RMSprop
from minidl.optim.averaging import SWA, Lookahead, Ranger, RangerLARS, update_bn
from minidl.optim.curvature import gradient_noise_scale, hessian_trace, hessian_vector_product, top_hessian_eigenvalue
from minidl.optim.layerwise import LAMB, LARS, NovoGrad
from minidl.optim.lbfgs import LBFGS
from minidl.optim.lr_finder import lr_range_test
from minidl.optim.optimizer import Optimizer
from minidl.optim.regularization import l1_penalty, weight_decay_groups
from minidl.optim.schedules import ScheduleLR
from minidl.optim.sgd import NAG, SGD, SGDM
from minidl.optim.switch import SwitchOptimizer

__all__ = [
    "AMSGrad", "AdaDelta", "AdaGrad", "AdaHessian", "Adadelta", "Adagrad", "RMSprop", "Adam", "AdamW", "LAMB",
    "LARS", "LBFGS", "ScheduleLR",
    "Lookahead", "NAG", "NAdam", "NovoGrad", "Optimizer", "RAdam", "RMSProp", "Ranger", "RangerLARS",
    "SGD", "SGDM", "SWA", "SwitchOptimizer", "clip_grad_norm_", "clip_grad_value_", "gradient_noise_scale",
    "hessian_trace",
    "hessian_vector_product", "l1_penalty", "lr_range_test", "lr_scheduler", "schedules", "top_hessian_eigenvalue",
    "update_bn", "weight_decay_groups",
]

# Low-precision training: pure 16-bit updates (stochastic rounding, Kahan) and quantized gradients (QSGD).
# Wrappers around an optimizer, as Lookahead, documented on their modules' pages rather than in __all__ (the
# lists of update equations that every optimizer test walks).
from minidl.optim.low_precision import LowPrecisionOptimizer  # noqa: E402, F401
from minidl.optim.quantized_grad import QuantizedGradients  # noqa: E402, F401
