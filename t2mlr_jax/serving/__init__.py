"""Serving: the decode engine (slots, each with its own cache and recurrent state), the
OpenAI-compatible server over it, the chat session and its page."""
