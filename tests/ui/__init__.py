"""Real-browser tests (chromium + Playwright); see conftest.py."""
