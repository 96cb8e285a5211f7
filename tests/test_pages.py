"""How the governor's pages write times: a <time> element per moment, which the page's script
shows in the reader's clock (UTC stays the text without JavaScript, and the tooltip)."""

from datetime import datetime, timezone

from jupyter_gpu_gov.hub.page_handler import time_tag, times_in_text

NOW = datetime(2026, 1, 5, 0, 10, tzinfo=timezone.utc)


def test_a_moment_is_a_time_element_in_utc():
    assert time_tag(datetime(2026, 1, 5, 9, 14, 30, tzinfo=timezone.utc)) == (
        '<time datetime="2026-01-05T09:14:30Z">2026-01-05 09:14 UTC</time>'
    )
    assert time_tag(None) == ""


def test_the_utc_times_in_a_reason_become_time_elements_and_the_rest_stays_text():
    reason = "GPU idle since 2026-01-04 23:50 UTC; server stopped at 00:30 UTC <b>unless</b>"
    assert times_in_text(reason, NOW) == (
        'GPU idle since <time datetime="2026-01-04T23:50:00Z">2026-01-04 23:50 UTC</time>; '
        'server stopped at <time datetime="2026-01-05T00:30:00Z">2026-01-05 00:30 UTC</time>'
        " &lt;b&gt;unless&lt;/b&gt;"
    )


def test_a_time_without_a_day_is_the_one_nearest_now():
    # 23:55 UTC read ten minutes after midnight is yesterday's.
    assert 'datetime="2026-01-04T23:55:00Z"' in times_in_text("since 23:55 UTC", NOW)
    assert times_in_text("no time: 25:99 UTC", NOW) == "no time: 25:99 UTC"
    assert times_in_text(None, NOW) == ""


def test_a_policy_match_reads_as_written_not_as_a_python_dict():
    from jupyter_gpu_gov.core.policy import load_policies
    from jupyter_gpu_gov.hub.page_handler import env
    from jupyter_gpu_gov.hub.views import policy_view

    p = load_policies(
        [
            {
                "name": "vision",
                "match": {
                    "teams": "vision",
                    "tiers": ["h100", "a100"],
                    "server_names": ["", "<b>x</b>"],
                    "labels": {"gpu-gov/borrowed": "true"},
                },
            },
        ]
    )[0]
    cell = env.from_string("{{ m|match }}").render(m=policy_view(p)["match"])
    assert cell == (
        "tiers: h100, a100; teams: vision; server_names: (default), &lt;b&gt;x&lt;/b&gt;; "
        "labels: gpu-gov/borrowed=true"
    )
