"""The launcher names the process whose failure caused the run's, not one that died of its loss."""
import signal

from training.launch import PEER_LOST, _describe


def test_a_killed_rank_is_named_over_a_peer_that_aborted_at_the_same_poll(tmp_path):
    first = [(0, -signal.SIGABRT), (1, -signal.SIGKILL)]
    assert _describe(first, [], tmp_path) == "training process 1 died (signal 9, SIGKILL)"


def test_a_failure_seen_first_wins_over_a_later_one(tmp_path):
    assert _describe([(1, -signal.SIGABRT)], [(0, -signal.SIGKILL)], tmp_path) == \
        "training process 1 died (signal 6, SIGABRT)"


def test_an_exit_code_of_its_own_beats_a_lost_peer(tmp_path):
    assert _describe([(0, PEER_LOST), (1, 1)], [], tmp_path) == \
        "training process 1 failed (exit code 1; its error is above)"
    assert _describe([(0, PEER_LOST), (1, PEER_LOST)], [], tmp_path) == \
        "training process 0 lost contact with the other training processes"


def test_a_user_error_message_is_reported_as_written(tmp_path):
    (tmp_path / "rank-1.txt").write_text("fold 0: no learners in the test split\n")
    assert _describe([(0, PEER_LOST)], [(1, 2)], tmp_path) == "fold 0: no learners in the test split"
