"""Every size and time limit the services enforce, each defined once with the reason for its value.

The gateway, the student party, the guardian and the answering parties import
these, so they agree on what is too large and say so in the same words. The
light ``clients`` package does not import them: it learns a limit from the
refusal's message.
"""

from __future__ import annotations

from capc.data.generators import MAX_COUNT
from capc.mpc.channel import DEFAULT_MAX_FRAME, HEADER_BYTES, TAG_BYTES

#: Queries in one round. The guardian garbles the whole round's circuit and
#: sends it as one 2PC message, which capc.mpc caps at 512 MiB: the deployed
#: 10-class confident-GNMax circuit takes about 27 KB a query (111 MB at 4,096),
#: a 5-label powerset one 66 KB (272 MB at 4,096, but 545 MB, over the cap, at
#: 8,192). 4,096 also keeps a round's (3, 32, 32) float32 queries at 50 MB and
#: 1,024-wide vote shares at 32 MiB, under MAX_MESSAGE_BYTES.
MAX_BATCH = 4096

#: Queries per round when a job names no batch size: rounds of a few seconds,
#: so a job's progress moves often and a failed round loses little.
DEFAULT_BATCH = 256

#: Queries in one student job. A job's queries are kept whole in the job store
#: and labelled batch by batch; 100,000 bounds what one job stores and runs.
MAX_JOB_QUERIES = 100_000

#: Programmatic queries one recipe may name; set by capc.data.generators.
MAX_RECIPE_COUNT = MAX_COUNT

#: Ciphertexts one encrypted round may name. Each is at most 4 MiB (capc.he), and
#: the batched layout sends one per input feature: 8,192 covers (3, 32, 32)
#: inputs (3,072) and the single layout of small batches.
MAX_CIPHERTEXTS = 8192

#: Labelled queries per results page: 4,096 (3, 32, 32) float32 queries are
#: 50 MB, under MAX_MESSAGE_BYTES. The gateway asks for pages of exactly this size.
RESULTS_PAGE = 4096

#: Entries per page of a listing (jobs, ledger, audit), and when none is asked for.
MAX_LIST_PAGE = 1000
DEFAULT_LIST_PAGE = 100

#: Teachers one answering party may vote with (an ensemble): the circuit's word
#: grows with the log of the consortium's total, and a party registers one
#: TeacherInfo per teacher.
MAX_TEACHERS_PER_PARTY = 1024

#: Parties one round request may leave out (the CaPC loop: a querying hospital
#: names its own answering party): the consortium's size is far below it.
MAX_EXCLUDED = 1024

#: Records in one prediction request: 4,096 (3, 32, 32) float32 records are 50 MB,
#: under MAX_MESSAGE_BYTES, and a forward pass over them takes seconds on a CPU.
MAX_PREDICT_RECORDS = 4096

#: Records of a student's reference batch, whose statistics a current-statistics
#: model stores (capc.models.inference.reference_statistics): passed through the
#: body in one batch, so it is bounded like a round.
MAX_REFERENCE_RECORDS = 1024

#: Task definitions an answering party keeps (a guardian's stream defines each task,
#: by name and config hash, before its first round): a consortium runs a handful of
#: tasks; a guardian defining more has the oldest forgotten, and rounds naming it
#: are refused until it is defined again.
MAX_DEFINED_TASKS = 64

#: Student models whose weights the student party keeps loaded for predictions.
PREDICT_CACHE_MODELS = 4

#: Training epochs of a student model: 200 bounds one training job's time.
MAX_EPOCHS = 200
DEFAULT_EPOCHS = 10

#: Times a querier's own labelled records may enter its student's fit (the CaPC loop's
#: ``own_weight``): the fit holds k copies of their features, and past 16 the bought
#: labels barely count against them.
MAX_OWN_WEIGHT = 16

#: Largest gRPC message either way. Garbled rounds travel in frames of at most
#: 4 MiB (capc.mpc); vote shares of a MAX_BATCH round of 1,024 classes are
#: 32 MiB; CKKS contexts with rotation keys reach about 100 MB.
MAX_MESSAGE_BYTES = 128 * 1024 * 1024

#: Largest query tensor one message carries: the rest of the message (header,
#: mechanism) needs far less than the 1 MiB left over. The gateway holds an upload's
#: queries to it, as stored and as float32, from their .npy headers before inflating.
MAX_TENSOR_BYTES = MAX_MESSAGE_BYTES - 1024 * 1024

#: Largest request body the gateway takes by default (``--max-upload-mb``): an
#: upload is buffered whole, and 64 MiB of float32 queries fits one message.
MAX_UPLOAD_BYTES = 64 * 1024 * 1024

#: Memory the gateway's uploads hold at once, all requests together
#: (``--max-uploads-mb``): each request's body (reserved as it arrives) and, for an
#: upload, three float32-sized copies of its queries (the inflated array, its float32
#: copy and the job message's; reserved from the headers before inflating). One upload
#: at the largest sizes needs 64 MiB + 3 x 127 MiB, so 1 GiB admits two of those, or
#: many small ones; without a shared bound a few hundred concurrent uploads would take
#: the gateway's memory. Past it a request gets 503 with Retry-After.
MAX_UPLOADS_IN_FLIGHT_BYTES = 16 * MAX_UPLOAD_BYTES

#: Arrays one uploaded .npz may hold: the queries 'x' and a few companions (labels,
#: ids) that np.savez writes beside them. Checked from the zip's end record before its
#: directory is parsed, so a 64 MiB upload of a million empty members costs nothing.
MAX_UPLOAD_MEMBERS = 8

#: Requests one gateway token may make a minute (``--rate-limit``), in bursts of up
#: to as many. capcctl polls a job twice a second and the dashboard reads three routes
#: every 5 s, both far below; a runaway script gets 429 with Retry-After instead of
#: tying up the student party and the guardian.
GATEWAY_REQUESTS_PER_MINUTE = 600


#: Requests to /healthz one client address may make a minute, in bursts of up to as
#: many. /healthz needs no token, so it is limited by address: a probe every few
#: seconds from each of a few load balancers behind one address stays far below.
HEALTHZ_REQUESTS_PER_MINUTE = 120

#: Seconds /healthz answers from its last reading of the backends before it reads them
#: again (each reading is up to two gRPC health checks of 3 s each).
HEALTH_CACHE_SECONDS = 5.0

#: Payload bytes of one 2PC frame on the Compute stream: capc.mpc splits messages into
#: frames of at most 4 MiB, each with its 32-byte header and 16-byte tag. A larger frame
#: is refused on arrival and the stream is ended, before it is buffered.
MAX_MPC_FRAME_BYTES = DEFAULT_MAX_FRAME + HEADER_BYTES + TAG_BYTES

#: 2PC frames buffered per direction of one Compute stream (at most 32 MiB). A side
#: that gets further ahead waits, and gRPC's flow control holds the sender back.
MPC_STREAM_BUFFER_FRAMES = 8

#: Seconds a service waits for its peer to take a frame off a full stream buffer
#: before it gives the stream up: a peer that stopped reading holds no memory longer.
STREAM_SEND_TIMEOUT_S = 120.0

#: Payload bytes a relayed blob is cut into (encrypted-query mode; services.common.relay).
RELAY_CHUNK_BYTES = 1 << 20

#: Largest relayed frame the guardian forwards: a chunk, or a 2PC frame of the
#: party's own session (at most a chunk plus its header and tag), sealed with a
#: 16-byte tag. 1 KiB covers the overheads.
MAX_RELAY_FRAME_BYTES = RELAY_CHUNK_BYTES + 1024

#: Relayed frames buffered for one student's Relay stream, and for one end of a
#: sealed channel (at most 64 MiB each): an exchange sends its blobs without waiting,
#: so the sender then waits for the reader.
RELAY_BUFFER_FRAMES = 64

#: Messages the guardian holds for one answering party (round work, cancellations,
#: relayed frames) until the party reads them. A relayed frame waits for room; round
#: work that finds no room leaves the party out of that round.
PARTY_OUTBOX_MESSAGES = 64

#: Messages an answering party queues for the guardian (shares, failures, relayed
#: frames, heartbeats); its round threads wait while the guardian catches up.
PARTY_OUTGOING_MESSAGES = 64

#: Streams one identity may hold open at once on the guardian (its Compute and
#: Relay streams; an answering party holds its one Connect stream). A student
#: client holds one Compute stream, plus one Relay stream in encrypted mode, so
#: 8 leaves room for a few clients and their reconnections; more is a leak or abuse.
MAX_STREAMS_PER_IDENTITY = 8

#: Rounds one querier may hold opened but not yet computed or settled. A student
#: runs its rounds one after another; 16 leaves room for clients side by side, and
#: bounds the parties' budget one querier can hold in reservations at once.
MAX_OPEN_ROUNDS_PER_QUERIER = 16

#: Seconds a round may stay opened but not released (``capc guardian --round-timeout``)
#: before the guardian aborts it and returns its reservations. A round's shares arrive
#: within the share timeout (60 s by default) and a MAX_BATCH 2PC takes well under a
#: minute on one core, so ten minutes never cuts a live round, yet a student that opens
#: rounds and vanishes holds the parties' budgets for minutes, not until a restart.
ROUND_TIMEOUT_S = 600.0


def count_refusal(count: int, limit: int, what: str) -> str | None:
    """Why ``what`` (e.g. "a batch") may not hold ``count`` queries; None when it may.

    Every service words a count refusal through here, so the same limit reads
    the same wherever it is hit.
    """
    if count < 1:
        return f"{what} must hold at least 1 query, got {count}"
    if count > limit:
        return f"{what} holds at most {limit} queries, got {count}; use {limit} or fewer"
    return None


def batch_refusal(count: int) -> str | None:
    """Why a round may not take ``count`` queries (None: it may)."""
    return count_refusal(count, MAX_BATCH, "a batch")


#: Most open rounds one party message (Register, heartbeat) may ask the guardian to settle.
MAX_SETTLE = 256

#: Seconds between two audit entries for refused second streams under one identity:
#: each refusal is logged, but a key in two places that retries in a loop must not
#: grow the audit log without bound. The next entry counts the refusals in between.
DUPLICATE_AUDIT_EVERY_S = 60.0
