"""`mgcaffe parse_log`: LOG.train / LOG.test as Caffe's tools/extra/parse_log.py writes them
(the expected tables below are worked out by hand from that script's rules)."""

from __future__ import annotations

LOG = """\
I1201 10:00:00.000000  1 solver.cpp:1] Initializing solver from parameters:
base_lr: 0.01
I1201 10:00:01.000000  1 solver.cpp:2] Solving LeNet
I1201 10:00:01.500000  1 solver.cpp:3] Iteration 0, Testing net (#0)
I1201 10:00:02.000000  1 solver.cpp:4]     Test net output #0: accuracy = 0.1
I1201 10:00:02.000000  1 solver.cpp:4]     Test net output #1: loss = 2.3 (* 1 = 2.3 loss)
I1201 10:00:02.250000  1 solver.cpp:5] Iteration 0, loss = 2.31
I1201 10:00:02.250000  1 solver.cpp:6]     Train net output #0: loss = 2.31 (* 1 = 2.31 loss)
I1201 10:00:02.250000  1 solver.cpp:7] Iteration 0, lr = 0.01
I1201 10:00:03.000000  1 solver.cpp:5] Iteration 100 (1 iter/s, 1s/100 iters), loss = 0.5
I1201 10:00:03.000000  1 solver.cpp:6]     Train net output #0: loss = 0.4 (* 1 = 0.4 loss)
I1201 10:00:03.000000  1 solver.cpp:7] Iteration 100, lr = 0.005

I1201 10:00:04.000000  1 solver.cpp:3] Iteration 200, Testing net (#0)
I1201 10:00:04.500000  1 solver.cpp:4]     Test net output #0: accuracy = 0.9
I1201 10:00:04.500000  1 solver.cpp:4]     Test net output #1: loss = 0.3 (* 1 = 0.3 loss)
I1201 10:00:05.000000  1 solver.cpp:5] Iteration 200, loss = 0.25
I1201 10:00:05.000000  1 solver.cpp:6]     Train net output #0: loss = 2e-1 (* 1 = 0.2 loss)
I1201 10:00:06.000000  1 solver.cpp:3] Iteration 300, Testing net (#0)
I1201 10:00:06.500000  1 solver.cpp:4]     Test net output #0: accuracy = 0.95
"""

# The first rows take the second row's learning rate; the last test row (iteration 300)
# never gets its second column, so it is not written.
TRAIN = ("NumIters,Seconds,LearningRate,loss\r\n"
         "0.0,1.25,0.01,2.31\r\n"
         "100.0,2.0,0.01,0.4\r\n"
         "200.0,4.0,0.005,0.2\r\n")
TEST = ("NumIters,Seconds,LearningRate,accuracy,loss\r\n"
        "0.0,1.0,0.005,0.1,2.3\r\n"
        "200.0,3.5,0.005,0.9,0.3\r\n")


def test_parse_log_writes_caffe_tables(tmp_path, cli):
    path = tmp_path / "caffe.INFO"
    path.write_text(LOG)
    rc, err = cli("parse_log", path, tmp_path / "out")
    assert rc == 0, err
    assert (tmp_path / "out" / "caffe.INFO.train").read_bytes().decode() == TRAIN
    assert (tmp_path / "out" / "caffe.INFO.test").read_bytes().decode() == TEST


def test_parse_log_of_an_mgcaffe_training_run(tmp_path, model, cli):
    rc, err = cli("train", "-solver", model.solver())
    assert rc == 0, err
    log = tmp_path / "train.log"
    log.write_text(err)
    assert cli("parse_log", "--delimiter", ";", log, tmp_path)[0] == 0
    lines = (tmp_path / "train.log.train").read_text().splitlines()
    assert lines[0] == "NumIters;Seconds;LearningRate;loss"
    # display: 5 over 20 iterations: outputs at 0, 5, 10, 15 (the final `Iteration 20, loss`
    # line has no net outputs, as in Caffe).
    assert [row.split(";")[0] for row in lines[1:]] == ["0.0", "5.0", "10.0", "15.0"]
    assert all(row.split(";")[2] == "0.01" for row in lines[1:])
    assert not (tmp_path / "train.log.test").exists()  # no test net: no table


def test_parse_log_needs_a_solving_line(tmp_path, cli):
    path = tmp_path / "x.log"
    path.write_text("I1201 10:00:00.000000  1 a.cpp:1] Iteration 1, lr = 0.1\n")
    rc, err = cli("parse_log", path, tmp_path)
    assert rc == 1 and "no glog-stamped 'Solving ...' line" in err
