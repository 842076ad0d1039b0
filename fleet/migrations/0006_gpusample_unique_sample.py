"""Samples are unique per (GPU, MIG GPU-instance id, timestamp): data an agent re-sends under a
new report seq (it lost its state and registered again) is stored once.

A unique index on a partitioned table must contain the partition key (``ts``); ``NULLS NOT
DISTINCT`` makes a whole-GPU sample (GI id null) collide with itself. It leads with
``(gpu_uuid, ts)`` and so replaces the ``(gpu_uuid, ts)`` index for the range reads: ingest
keeps the same number of indexes to maintain. Duplicates already stored are removed first
(the oldest copy stays).
"""

from django.db import migrations

FORWARD = """
DELETE FROM fleet_gpusample a
 USING fleet_gpusample b
 WHERE a.gpu_uuid = b.gpu_uuid
   AND a.ts = b.ts
   AND a.mig_gpu_instance_id IS NOT DISTINCT FROM b.mig_gpu_instance_id
   AND a.id > b.id;
CREATE UNIQUE INDEX fleet_gpusample_sample_uniq
    ON fleet_gpusample (gpu_uuid, ts, mig_gpu_instance_id) NULLS NOT DISTINCT;
DROP INDEX IF EXISTS fleet_gpusample_gpu_ts;
"""

BACKWARD = """
CREATE INDEX IF NOT EXISTS fleet_gpusample_gpu_ts ON fleet_gpusample (gpu_uuid, ts);
DROP INDEX IF EXISTS fleet_gpusample_sample_uniq;
"""


class Migration(migrations.Migration):
    dependencies = [("fleet", "0005_host_drain_progress")]

    operations = [migrations.RunSQL(FORWARD, BACKWARD)]
