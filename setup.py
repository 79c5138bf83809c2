from setuptools import setup

setup(
    name="customop",
    version="0.1.0",
    description="MinPy-style custom operators for Apache MXNet 1.9",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11,<3.12",
    packages=["customop", "ops"],
    install_requires=["numpy<1.24", "autograd>=1.7"],
    extras_require={
        "cpu": ["mxnet==1.9.1"],
        "cu112": ["mxnet-cu112==1.9.1"],
        "test": ["mxnet==1.9.1", "pytest", "ruff"],
    },
)
