"""Weight encodings of the IR, one file per encoding, registered by ONNX op type (domain ai.edgebnn)."""

from __future__ import annotations

from edgebnn.ir.encodings.base import ENCODINGS, Encoding, Grid, NoiseNeed, register_encoding
from edgebnn.ir.encodings.binary import BinaryWeight
from edgebnn.ir.encodings.codebook import CodebookWeight
from edgebnn.ir.encodings.dropout import MASK_SUFFIX, DropoutMask
from edgebnn.ir.encodings.fixedpoint import FixedPointWeight
from edgebnn.ir.encodings.gaussian import GaussianWeight
from edgebnn.ir.encodings.intcount import IntCountWeight
from edgebnn.ir.encodings.joint import JointGroup, draw_weight
from edgebnn.ir.encodings.kron import DenseFixedWeight, DenseGaussianWeight, KronFixedWeight, KronGaussianWeight
from edgebnn.ir.encodings.lowrank import LowRankFixedWeight, LowRankGaussianWeight
from edgebnn.ir.encodings.members import MemberSet, MemberSetFixedWeight, MemberSetWeight
from edgebnn.ir.encodings.rowcode import RowCode
from edgebnn.ir.encodings.sigmacode import SigmaCode
from edgebnn.ir.encodings.ternary import TernaryWeight

__all__ = [
    "ENCODINGS",
    "MASK_SUFFIX",
    "BinaryWeight",
    "CodebookWeight",
    "DenseFixedWeight",
    "DenseGaussianWeight",
    "DropoutMask",
    "Encoding",
    "FixedPointWeight",
    "GaussianWeight",
    "Grid",
    "IntCountWeight",
    "JointGroup",
    "KronFixedWeight",
    "KronGaussianWeight",
    "LowRankFixedWeight",
    "LowRankGaussianWeight",
    "MemberSet",
    "MemberSetFixedWeight",
    "MemberSetWeight",
    "NoiseNeed",
    "RowCode",
    "SigmaCode",
    "TernaryWeight",
    "draw_weight",
    "register_encoding",
]
