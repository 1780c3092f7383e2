"""The transaction coordinator: producer ids, transactional ids and their transactions,
persisted in the internal topic ``__transaction_state``."""
