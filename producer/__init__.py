"""The command line: `python -m producer enqueue|status|export|run|reconcile|resume|cancel|mock-llm`."""
