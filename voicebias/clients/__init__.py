"""Clients of external services: chat completions on the openai and google-genai SDKs, and one retry
helper for plain REST."""
