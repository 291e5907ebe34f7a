"""Files in and out: prototxt and binary protos (protoio.py), Caffe's upgrades of old formats
(upgrade.py, upgrade_v0.py), JSON inputs (jsonio.py), output paths named by flags (outputs.py)
and the lock that keeps one training per snapshot prefix (snapshot_lock.py).
"""
