"""The job's data: token files prepared from local text and served to every data-parallel rank
(tokens: ``zeropp-hier data prepare`` and the ``Loader``; prepare_stream: the streaming,
multi-process prepare; documents: the input formats read, plain, compressed and columnar;
token_format: the prepared directory's format, named once), and Megatron / GPT-NeoX ``.bin``/
``.idx`` pairs read in place (indexed), blended (blend) and split (split). Imports nothing of the job's
spine (app/) and no other family."""
