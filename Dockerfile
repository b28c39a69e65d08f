FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY requirements ./requirements
COPY examforge ./examforge
COPY mockllm ./mockllm
COPY tasks ./tasks
COPY producer ./producer
COPY storage ./storage
COPY runner ./runner
# Through the lock: the versions the test suite was proved with.
RUN pip install -c requirements/lock.txt .
COPY exams ./exams
RUN useradd --create-home examforge && chown -R examforge /app
USER examforge
ENTRYPOINT []
CMD ["python", "-m", "producer", "--help"]
