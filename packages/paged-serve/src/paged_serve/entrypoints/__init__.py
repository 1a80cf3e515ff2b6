"""User entry points: the offline LLM class, the OpenAI-compatible server and the command line."""
