from setuptools import find_packages, setup

setup(
    name="ackqueue",
    version="0.1.0",
    description="A persistent, acknowledging drop-in replacement for queue.Queue, on ZODB",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["ackqueue", "ackqueue.*"]),
    package_data={"ackqueue.service": ["openapi.json"]},   # the OpenAPI document
    python_requires=">=3.9",
    install_requires=["ZODB>=5.8", "ZEO>=6", "persistent>=4.9", "transaction>=3.0",
                      "BTrees>=4.11", "click>=8.1"],
    extras_require={
        "test": ["pytest>=7", "pytest-timeout>=2", "hypothesis>=6", "aiohttp>=3.9",
                 "click>=8.1", "rich>=13", "prometheus_client>=0.17", "schemathesis>=4",
                 "boto3>=1.34", "awscli>=1.32", "pyspark>=4", "pyarrow"],
        "service": ["aiohttp>=3.9", "prometheus_client>=0.17"],
        "cli": ["rich>=13"],
        "spark": ["pyspark>=4", "pyarrow"],
        "bench": ["persist-queue>=1.0", "litequeue>=0.9", "matplotlib>=3.7", "psutil>=5.9",
                  "aiohttp>=3.9", "boto3>=1.34", "moto[server]>=5", "pyspark>=4", "pyarrow",
                  "relstorage>=4"],
    },
    entry_points={"console_scripts": ["ackqueue=ackqueue.cli:main"]},
)
