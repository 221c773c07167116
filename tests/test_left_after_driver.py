"""runtime.contract.left_after_driver: a worker that left on the driver's published exit code is told
from one that failed by itself, by the launcher's own last line, whatever the node's other processes
print after it."""
from runtime.contract import driver_finished_line, left_after_driver

JOINED = "[launch node1/3 7353b66ab5fa] joined: this node's Ray is up at 172.25.0.3:20001"
LEFT = f"[launch node1/3 7353b66ab5fa] {driver_finished_line(1)}"
ZYGOTE = "zygote on 7353b66ab5fa: ready at /tmp/raytrain-zygote-271rkxyx/zygote.sock after 13.51s (torch)"


def test_the_launcher_s_last_line_decides():
    assert left_after_driver("\n".join([JOINED, LEFT]))
    # the zygote's line came after the launcher's last (a busy machine): still a worker that left
    assert left_after_driver("\n".join([JOINED, LEFT, ZYGOTE, ""]))
    assert left_after_driver(f"[launch] {driver_finished_line(-9)}\n")


def test_a_worker_that_failed_by_itself_is_not_taken_for_one_that_left():
    assert not left_after_driver("\n".join([JOINED, ZYGOTE]))
    assert not left_after_driver("\n".join([LEFT, "[launch node1/3 7353b66ab5fa] this node's Ray died; leaving"]))
    # the driver's own output saying the words is not the launcher's line
    assert not left_after_driver("\n".join([JOINED, driver_finished_line(1)]))
    assert not left_after_driver("")
