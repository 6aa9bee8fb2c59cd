"""A key over its rate (20 requests/s, burst 40) gets 429 RATE_LIMITED:
the client retries after Retry-After, or raises the code once its retries
are spent. Its own `tollgate dev`, so that the other tests keep their rate."""

from __future__ import annotations

import sys
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tollgate import APIError, Client  # noqa: E402

from tests.devserver import DevServer  # noqa: E402


class RateLimit(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.dev = DevServer()

    @classmethod
    def tearDownClass(cls) -> None:
        cls.dev.stop()

    def test_rate_limited_requests_are_retried_after_retry_after_or_raise_the_code(self):
        eager = Client(self.dev.url, self.dev.key, retries=0)
        with self.assertRaises(APIError) as e:
            for _ in range(200):
                eager.approvals()
        self.assertEqual((e.exception.status, e.exception.code), (429, "RATE_LIMITED"))
        self.assertIsNotNone(e.exception.retry_after)
        patient = Client(self.dev.url, self.dev.key, retries=3)
        for _ in range(60):  # past the burst: some answers are 429 and retried
            self.assertEqual(patient.approvals(), [])


if __name__ == "__main__":
    unittest.main()
