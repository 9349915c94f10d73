"""Supervised fine-tuning: datums from rendered conversations live in :mod:`tempering.supervised.data`.

Example::

    from tempering.supervised.data import conversations_to_datums
"""
