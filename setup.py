"""t2mlr_jax: transformers with temporal middle-layer recurrence (T2MLR, LRT) in JAX/Flax."""

from setuptools import find_packages, setup

# python -m t2mlr_jax.serve (docs/serving.md); its tests also drive it with OpenAI's client
SERVE = ["fastapi>=0.110,<1", "uvicorn>=0.29,<1"]

setup(
    name="t2mlr_jax",
    version="0.1.0",
    description="Transformers with temporal middle-layer recurrence (T2MLR) in JAX/Flax",
    packages=find_packages(include=["t2mlr_jax", "t2mlr_jax.*"]),
    # the GPU cards' compiler targets (topologies.CARDS); the server's chat page
    package_data={"t2mlr_jax": ["accel/gpu_targets/*.txtpb", "serving/chat_page.html"]},
    python_requires=">=3.10",
    install_requires=[
        "jax>=0.7,<0.12",
        "flax>=0.11,<0.13",
        "optax>=0.2.6,<0.3",
        "orbax-checkpoint>=0.11,<0.13",
        "grain>=0.2.10,<0.3",
        "ml-collections>=1.0,<2",
        "chex>=0.1.89,<0.2",
        "tensorflow-datasets>=4.9,<5",
        "numpy>=1.26,<3",
        "absl-py>=2.0,<3",
        "safetensors>=0.4,<1",
        "tokenizers>=0.20,<1",
        "array-record>=0.5,<1",
        "pyarrow>=14",
        "gguf>=0.17,<1",
        "jinja2>=3.1,<4",
        "tensorboardX>=2.6,<3",
        "tqdm>=4.66,<5",
        "matplotlib>=3.8,<4",
    ],
    extras_require={
        "test": ["pytest>=8,<10", "pytest-xdist>=3.5,<4", "torch==2.13.0", "transformers>=4.57,<6",
                 "accelerate>=1.0,<2", "ruff==0.17.6", "openai>=1.30,<4", "selenium>=4.20,<5",
                 "tenacity>=8,<10", "trl==1.16.0", *SERVE],   # tenacity: lm-eval's API models;
                 # trl: its GRPO loss, checked against ours (tests/train/test_grpo.py)
        "serve": SERVE,
        "tpu": ["jax[tpu]>=0.7,<0.12"],
        # lm-evaluation-harness: python -m t2mlr_jax.lm_eval (docs/evaluation.md)
        "eval": ["lm-eval==0.4.13"],
    },
)
