"""tempering_protocols: the interfaces researchers implement, and the values they exchange.

Implement these in your own package; tempering's trainers run them. Check an implementation
with the conformance kit in ``tempering_protocols.testing``.
"""

from tempering_protocols.backend import CustomLossFn, Future, SamplingClient, TrainingClient
from tempering_protocols.evaluators import SamplingClientEvaluator, TrainingClientEvaluator
from tempering_protocols.incontext import InContextTask, InContextTaskFamily, SourceLearner
from tempering_protocols.policies import MessageCompleter, TokenCompleter
from tempering_protocols.rendering import Renderer, Tokenizer, decode_text
from tempering_protocols.rl import (
    MASK_TURN,
    PARSE_ERROR_MASKED,
    Env,
    EnvGroupBuilder,
    RLDataset,
    RLDatasetBuilder,
)
from tempering_protocols.sandbox import Sandbox, SandboxResult, SandboxStatus
from tempering_protocols.supervised import (
    ComparisonDataset,
    ComparisonDatasetBuilder,
    SupervisedDataset,
    SupervisedDatasetBuilder,
)
from tempering_protocols.types import (
    Action,
    Comparison,
    FloatArray,
    LabeledComparison,
    Logprobs,
    Message,
    Metrics,
    Observation,
    StepResult,
    StopCondition,
    StopReason,
    SupervisedExample,
    TokenArray,
    TokensWithLogprobs,
    ToolCall,
    TrainOnWhat,
    Trajectory,
    TrajectoryGroup,
    Transition,
    UnparsedToolCall,
)

__version__ = "0.1.0"

__all__ = [
    "MASK_TURN",
    "PARSE_ERROR_MASKED",
    "Action",
    "Comparison",
    "ComparisonDataset",
    "ComparisonDatasetBuilder",
    "CustomLossFn",
    "Env",
    "EnvGroupBuilder",
    "FloatArray",
    "Future",
    "InContextTask",
    "InContextTaskFamily",
    "LabeledComparison",
    "Logprobs",
    "Message",
    "MessageCompleter",
    "Metrics",
    "Observation",
    "RLDataset",
    "RLDatasetBuilder",
    "Renderer",
    "SamplingClient",
    "SamplingClientEvaluator",
    "Sandbox",
    "SandboxResult",
    "SandboxStatus",
    "SourceLearner",
    "StepResult",
    "StopCondition",
    "StopReason",
    "SupervisedDataset",
    "SupervisedDatasetBuilder",
    "SupervisedExample",
    "TokenArray",
    "TokenCompleter",
    "Tokenizer",
    "TokensWithLogprobs",
    "ToolCall",
    "TrainOnWhat",
    "TrainingClient",
    "TrainingClientEvaluator",
    "Trajectory",
    "TrajectoryGroup",
    "Transition",
    "UnparsedToolCall",
    "__version__",
    "decode_text",
]
